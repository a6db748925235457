"""Turn-based PettingZoo games (``AECEnv``: tictactoe, connect four, chess) seen as a ParallelEnv
in which only the agent to move acts.

Each step plays the move of ``agent_selection``; the other agents are present but not acting
(``agent_mask`` False), so nothing is learned from their slots that step. Rewards reach every agent
at the step they are given, also an agent waiting for its turn: the loser's -1 arrives with the
winner's move, and the runner credits it to the loser's last move (rewards between two of an
agent's decisions belong to the decision before them). An agent whose game is over is stepped
out (``step(None)``, the AEC protocol for a finished agent) before the next move, and reported
terminated or truncated once, at the step it happened. Action masks come from the observations'
``{"observation", "action_mask"}`` as for any PettingZoo env.

Every episode also reports each agent's win (``won_<agent>``: 1 when its return beat every other
agent's), so a benchmark's evaluations give win rates beside the returns.
"""
from __future__ import annotations


def is_aec(env) -> bool:
    from pettingzoo.utils.env import AECEnv
    return isinstance(env, AECEnv)


class TurnBasedParallel:
    """The ParallelEnv face of an ``AECEnv``: ``agents`` is the agent to move (none once the game is
    over), ``step`` takes its action from a joint-action dict and returns every agent's
    observation, the move's rewards, and the agents whose game ended with it."""

    def __init__(self, env):
        self.aec = env
        self.possible_agents = list(env.possible_agents)
        self.metadata = getattr(env, "metadata", {})
        if hasattr(env, "state_space"):
            self.state_space = env.state_space
        self._returns: dict[str, float] = {}   # this episode's, per agent
        self._done: set[str] = set()           # agents whose game is over, reported once

    def observation_space(self, agent):
        return self.aec.observation_space(agent)

    def action_space(self, agent):
        return self.aec.action_space(agent)

    def state(self):
        return self.aec.state()

    @property
    def agents(self) -> list[str]:
        return [self.aec.agent_selection] if self.aec.agents else []

    def _observations(self) -> dict:
        return {a: self.aec.observe(a) for a in self.aec.agents}

    def reset(self, seed=None, options=None):
        self.aec.reset(seed=seed, options=options)
        self._returns = {a: 0.0 for a in self.possible_agents}
        self._done = set()
        self._step_out_finished()
        return self._observations(), dict(self.aec.infos)

    def _step_out_finished(self) -> None:
        """Finished agents leave the game when their turn comes (``step(None)``)."""
        aec = self.aec
        while aec.agents and (aec.terminations[aec.agent_selection] or aec.truncations[aec.agent_selection]):
            aec.step(None)

    def step(self, actions: dict):
        aec = self.aec
        mover = aec.agent_selection
        aec.step(actions[mover])
        rewards = {a: float(aec.rewards.get(a, 0.0)) for a in self.possible_agents}
        for a, r in rewards.items():
            self._returns[a] += r
        terminations, truncations = {}, {}
        for a in aec.agents:
            if a not in self._done and (aec.terminations[a] or aec.truncations[a]):
                self._done.add(a)
                terminations[a], truncations[a] = bool(aec.terminations[a]), bool(aec.truncations[a])
        terminations.setdefault(mover, False)
        truncations.setdefault(mover, False)
        infos = {a: aec.infos.get(a, {}) for a in aec.agents}
        self._step_out_finished()
        return self._observations(), rewards, terminations, truncations, infos

    def episode_stats(self) -> dict[str, float]:
        returns = self._returns
        stats = {}
        for a, r in returns.items():
            others = [v for b, v in returns.items() if b != a]
            stats[f"won_{a}"] = float(bool(others) and r > max(others))
        return stats

    def render(self):
        return self.aec.render()

    def close(self) -> None:
        self.aec.close()



def as_parallel(env):
    """``env`` itself, or a turn-based ``AECEnv`` behind its ParallelEnv face."""
    return TurnBasedParallel(env) if is_aec(env) else env

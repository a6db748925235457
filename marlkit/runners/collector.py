"""Collection: the vector env and the acting agents fill one rollout ``[T, E, A, ...]`` per call.

The collector acts through each group's *behaviour* (``Agent.behaviour``): the agent itself when
collection and update take turns, or a twin acting on the weights of the update before while the
learner updates the agent itself (``runner.overlap``). Either way it hands every transition to the
behaviour's ``store``, and the learning agents take the finished rollout over with ``hand_over``.
"""
from __future__ import annotations

import numpy as np

from marlkit.agents.base import ActOut, Agent, Bootstrap
from marlkit.buffers import Transition
from marlkit.envs.core import Observation


def advance_hidden(outs: dict, episode_end: np.ndarray, agent_end: dict) -> dict:
    """The hidden state for the next step: zero where an env, or one agent's episode, ended."""
    hidden = {}
    for g, out in outs.items():
        h = out.hidden
        ended = agent_end.get(g)
        if h is not None and (episode_end.any() or (ended is not None and ended.any())):
            h = h.copy()
            h[episode_end] = 0.0
            if ended is not None:
                h[ended] = 0.0
        hidden[g] = h
    return hidden


def count_episodes(state: dict, episodes) -> None:
    """Finished episodes' returns and statistics into ``state``'s recent ones and its count."""
    for episode in episodes:
        state["recent"].append(episode["return"])
        state["episodes"] += 1
        if "stats" in episode:
            state["recent_stats"].append(episode["stats"])


def act(agents: dict[str, Agent], obs: Observation, hidden: dict, explore: bool, block: int | None = None) -> dict:
    """Every group's ``ActOut`` for the envs of ``obs``: in one pass, or with ``block``
    (``runner.act_batch``) in passes over ``block`` consecutive envs each, so that an env is acted
    on in the same batch wherever its block is acted on (torch's kernels round a batch of another
    size differently)."""
    num_envs = len(obs.state)
    if block is None or block >= num_envs:
        return {g: agent.act(obs.obs[g], obs.state, obs.agent_mask[g], obs.action_mask[g], hidden[g], explore)
                for g, agent in agents.items()}
    parts: dict[str, list[ActOut]] = {g: [] for g in agents}
    for first in range(0, num_envs, block):
        count = min(block, num_envs - first)
        rows = obs.rows(first, count)
        for g, agent in agents.items():
            h = hidden[g][first:first + count] if hidden[g] is not None else None
            with agent.acting_on(first, count):
                parts[g].append(agent.act(rows.obs[g], rows.state, rows.agent_mask[g], rows.action_mask[g], h,
                                          explore))
    return {g: ActOut.join(outs) for g, outs in parts.items()}


class Collector:
    """Steps ``venv`` for ``horizon`` steps per ``collect``, acting with ``behaviours`` (one per
    group) on blocks of ``act_batch`` envs (None: all at once); ``learners`` are the groups whose
    transitions are stored."""

    def __init__(self, venv, agents: dict[str, Agent], learners: list[str], horizon: int, overlap: bool,
                 act_batch: int | None = None):
        self.venv, self.agents, self.learners, self.horizon = venv, agents, learners, horizon
        self.act_batch = act_batch
        self.behaviours = {g: agent.behaviour() if overlap and g in learners else agent for g, agent in agents.items()}

    def collect(self, state: dict) -> list[tuple[int, int, dict]]:
        """One rollout from ``state``'s observation and hidden state, which move on to where it
        ends; finished episodes are counted in ``state``. -> those episodes as ``(t, e, episode)``,
        in the order they ended."""
        obs, hidden = state["obs"], state["hidden"]
        finished = []
        for t in range(self.horizon):
            outs = act(self.behaviours, obs, hidden, explore=True, block=self.act_batch)
            res = self.venv.step({g: out.actions for g, out in outs.items()})
            for g in self.learners:
                out = outs[g]
                present = obs.agent_mask[g] if res.lost is None else obs.agent_mask[g] & ~res.lost[:, None]
                self.behaviours[g].store(Transition(
                    obs.obs[g], obs.state, present, obs.action_mask[g], out.actions,
                    out.log_prob, out.value, res.reward[g], res.terminated[g], res.truncated[g],
                    res.episode_end, res.final.obs[g], res.final.state, hidden[g], out.hidden, out.extras,
                    agent_end=res.agent_end.get(g), final_action_mask=res.final.action_mask[g]))
            finished += [(t, e, info["episode"]) for e, info in enumerate(res.infos) if "episode" in info]
            hidden = advance_hidden(outs, res.episode_end, res.agent_end)
            obs = res.next
        state["obs"], state["hidden"] = obs, hidden
        count_episodes(state, (episode for _, _, episode in finished))
        return finished

    def hand_over(self, state: dict) -> dict[str, Bootstrap]:
        """The learning agents take the rollout just collected; -> per learning group what to value
        its tail with, copied: the vector env writes its next step into the arrays it returned. A
        run resumed in fresh episodes keeps where its saved rollout ended as ``state["tail"]``."""
        obs, hidden = state.pop("tail", None) or (state["obs"], state["hidden"])
        boot = {}
        for g in self.learners:
            self.agents[g].take_rollout(self.behaviours[g])
            h = hidden[g]
            boot[g] = Bootstrap(obs.obs[g].copy(), obs.state.copy(), obs.agent_mask[g].copy(),
                                obs.action_mask[g].copy(), h.copy() if h is not None else None)
        return boot

    def sync(self) -> None:
        """The behaviours act with the learning agents' weights from now on."""
        for g in self.learners:
            self.agents[g].sync_behaviour(self.behaviours[g])

    def state_dict(self) -> dict:
        return {g: self.agents[g].behaviour_state(self.behaviours[g]) for g in self.learners}

    def load_state_dict(self, state: dict) -> None:
        for g in self.learners:
            self.agents[g].load_behaviour_state(self.behaviours[g], state.get(g))

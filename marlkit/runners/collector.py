"""Collection: the vector env and the acting policies fill one rollout ``[T, E, A, ...]`` per call.

The collector acts with a *snapshot* of each group's agent (``Agent.snapshot``): a copy that never
learns, brought up to date after every update (``sync``). So the agent itself may update while
the collector fills the next rollout (``runner.overlap``), acting with the weights of the update
before (policy lag 1). The learning groups' steps go into the storage their agent made
(``Agent.make_storage``); at a rollout boundary, ``finish`` turns what was collected into the
batches the agents learn from.
"""
from __future__ import annotations

import numpy as np

from marlkit.agents.base import ActOut, Agent, Progress
from marlkit.envs.core import Observation
from marlkit.storage import Bootstrap, Collected, Rollout, StorageLayout, Transition


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


def act(agents: dict[str, Agent], obs: Observation, hidden: dict, explore: bool, block: int | None = None,
        progress: Progress | None = None) -> dict:
    """Every group's ``ActOut`` for the envs of ``obs``: in one pass, or with ``block``
    (``runner.act_batch``) in passes over ``block`` consecutive envs each, so that an env is acted
    on in the same batch wherever its block is acted on (torch's kernels round a batch of another
    size differently)."""
    num_envs = len(obs.state)
    if block is None or block >= num_envs:
        return {g: agent.act(obs.obs[g], obs.state, obs.agent_mask[g], obs.action_mask[g], hidden[g], explore,
                             progress)
                for g, agent in agents.items()}
    parts: dict[str, list[ActOut]] = {g: [] for g in agents}
    for first in range(0, num_envs, block):
        count = min(block, num_envs - first)
        rows = obs.rows(first, count)
        for g, agent in agents.items():
            h = hidden[g][first:first + count] if hidden[g] is not None else None
            with agent.acting_on(first, count):
                parts[g].append(agent.act(rows.obs[g], rows.state, rows.agent_mask[g], rows.action_mask[g], h,
                                          explore, progress))
    return {g: ActOut.join(outs) for g, outs in parts.items()}


def fill_rollouts(venv, policies: dict[str, Agent], rollouts: dict[str, Rollout], obs: Observation, hidden: dict,
                  horizon: int, block: int | None,
                  progress: Progress | None) -> tuple[Observation, dict, list[tuple[int, int, dict]]]:
    """Step ``venv`` ``horizon`` times, acting with ``policies`` (every group's) from ``obs`` and
    ``hidden``, into ``rollouts`` (the learning groups'). -> (where the envs are then, the hidden
    state there, the episodes that finished as ``(t, e, episode)``, in the order they ended)."""
    finished = []
    for t in range(horizon):
        outs = act(policies, obs, hidden, True, block, progress)
        res = venv.step({g: out.actions for g, out in outs.items()})
        obs, hidden = record_step(rollouts, obs, hidden, outs, res, t, finished)
    return obs, hidden, finished


def record_step(rollouts: dict[str, Rollout], obs: Observation, hidden: dict, outs: dict, res,
                t: int, finished: list) -> tuple[Observation, dict]:
    """Store step ``t`` (acting ``outs`` from ``obs`` and ``hidden``, the vector env's ``res``)
    into ``rollouts``, its finished episodes onto ``finished`` -> the observation and hidden
    state the next step starts from."""
    for g, rollout in rollouts.items():
        out = outs[g]
        present = obs.agent_mask[g] if res.lost is None else obs.agent_mask[g] & ~res.lost[:, None]
        rollout.add(Transition(
            obs.obs[g], obs.state, present, obs.action_mask[g], out.actions,
            out.log_prob, out.value, res.reward[g], res.terminated[g], res.truncated[g],
            res.episode_end, res.final.obs[g], res.final.state, hidden[g], out.hidden, out.extras,
            agent_end=res.agent_end.get(g), final_action_mask=res.final.action_mask[g]))
    finished += [(t, e, info["episode"]) for e, info in enumerate(res.infos) if "episode" in info]
    return res.next, advance_hidden(outs, res.episode_end, res.agent_end)


def bootstrap_of(obs: Observation, hidden: dict, group: str) -> Bootstrap:
    """Group ``group``'s observation and hidden state after a rollout, copied: the vector env writes
    its next step into the arrays it returned."""
    h = hidden[group]
    return Bootstrap(obs.obs[group].copy(), obs.state.copy(), obs.agent_mask[group].copy(),
                     obs.action_mask[group].copy(), h.copy() if h is not None else None)


class Collector:
    """Steps ``venv`` for ``horizon`` steps per ``collect``, acting with snapshots of ``agents`` (one
    per group) on blocks of ``act_batch`` envs (None: all at once); ``learning_groups`` are the groups
    whose steps are stored. With ``overlap`` their storages hold two rollouts: one is collected
    while the other is trained on."""

    def __init__(self, venv, agents: dict[str, Agent], learning_groups: list[str], horizon: int, overlap: bool,
                 act_batch: int | None = None):
        self.venv, self.learning_groups, self.horizon, self.act_batch = venv, learning_groups, horizon, act_batch
        # the groups whose acting copies follow their agent after each update: the learning ones, but
        # for a self-play side that plays a past self (``set_policy``)
        self.synced = list(learning_groups)
        self.policies = {g: agent.snapshot() for g, agent in agents.items()}
        self.storages = {g: agents[g].make_storage(StorageLayout(agents[g].group, venv.spec, venv.num_envs, horizon,
                                                                 double=overlap))
                         for g in learning_groups}

    def collect(self, state, progress: Progress | None = None) -> dict[str, Collected]:
        """One rollout from ``state``'s observation and hidden state (a ``TrainState``), which move on
        to where it ends; finished episodes are counted in ``state``. -> per learning group, the
        rollout and what values its tail."""
        rollouts = {g: self.storages[g].next_rollout() for g in self.learning_groups}
        state.obs, state.hidden, finished = fill_rollouts(self.venv, self.policies, rollouts, state.obs, state.hidden,
                                                          self.horizon, self.act_batch, progress)
        state.count_episodes(episode for _, _, episode in finished)
        return {g: Collected(rollouts[g], bootstrap_of(state.obs, state.hidden, g)) for g in self.learning_groups}

    def finish(self, collected: dict[str, Collected]) -> dict:
        """Per learning group, the batch its agent learns from (``Storage.finish``); at a rollout
        boundary, while no update runs."""
        return {g: self.storages[g].finish(c) for g, c in collected.items()}

    def sync(self, agents: dict[str, Agent]) -> None:
        """The policies act with the learning agents' weights from now on."""
        for g in self.synced:
            self.set_policy(g, agents[g].policy_state_dict())

    def set_policy(self, group: str, policy_state) -> None:
        """Group ``group`` acts with ``policy_state`` (``Agent.policy_state_dict``) from the next
        rollout on."""
        self.policies[group].load_policy_state_dict(policy_state)

    def state_dict(self) -> dict:
        """Where the policies' streams stand and what the storages carry over (``TrainState``)."""
        return {"policy_streams": {g: p.streams.state_dict() for g, p in self.policies.items()},
                "storage": {g: s.state_dict() for g, s in self.storages.items()}}

    def load_state_dict(self, policy_streams: dict, storage: dict) -> None:
        for g, streams in policy_streams.items():
            self.policies[g].streams.load_state_dict(streams)
        for g, carried in storage.items():
            self.storages[g].load_state_dict(carried)

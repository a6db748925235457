"""Per-env running returns and lengths, reported as ``info["episode"]`` when an episode ends."""
from __future__ import annotations

import copy

import numpy as np

from marlkit.envs.core import EnvSpec, group_arrays


class EpisodeStats:
    """Per-env running returns; on episode end, per group the mean over agents of their return
    (agents never present in the episode are left out) and the episode length. Agents whose own
    episode ends while the env goes on (``agent_end``) report theirs at once: per group the mean
    over those agents, only for the groups they belong to, and their mean length in env steps."""

    def __init__(self, spec: EnvSpec, num_envs: int):
        self.returns = group_arrays(spec, np.float64, (num_envs,))
        self.seen = group_arrays(spec, bool, (num_envs,))
        self.length = np.zeros(num_envs, np.int64)
        self.agent_length = group_arrays(spec, np.int64, (num_envs,))

    def add(self, acting_mask: dict, reward: dict) -> None:
        """One step's rewards. Every reward counts, also one that reaches an agent between two of
        its decisions (Unity); an agent that does not act and gets no reward adds 0."""
        self.length += 1
        for g, returns in self.returns.items():
            returns += reward[g]
            self.seen[g] |= acting_mask[g]
            self.agent_length[g] += 1

    PER_GROUP = ("returns", "seen", "agent_length")   # accumulators kept per group, [E, A_g] each

    def rows(self, first: int, count: int) -> "EpisodeStats":
        """The accumulators of envs ``first .. first + count - 1`` (copies), for a worker of those envs."""
        part = slice(first, first + count)
        block = copy.copy(self)
        for name in self.PER_GROUP:
            setattr(block, name, {g: v[part].copy() for g, v in getattr(self, name).items()})
        block.length = self.length[part].copy()
        return block

    @staticmethod
    def join(parts: list["EpisodeStats"]) -> "EpisodeStats":
        """The accumulators of consecutive blocks of envs, in env order, as one."""
        whole = copy.copy(parts[0])
        for name in EpisodeStats.PER_GROUP:
            setattr(whole, name, {g: np.concatenate([getattr(p, name)[g] for p in parts])
                                  for g in getattr(parts[0], name)})
        whole.length = np.concatenate([p.length for p in parts])
        return whole

    def ended(self, episode_end: np.ndarray, agent_end: dict) -> list[dict]:
        """Per env, ``{"episode": {"return": {group: ...}, "length": ...}}`` for an episode that
        ended this step (the env's, or single agents'), else ``{}``; the ended returns restart."""
        infos: list[dict] = [{} for _ in range(len(episode_end))]
        if any(m.any() for m in agent_end.values()):
            self._agents_ended(infos, episode_end, agent_end)
        if episode_end.any():
            self._envs_ended(infos, episode_end)
        return infos

    def _agents_ended(self, infos: list[dict], episode_end: np.ndarray, agent_end: dict) -> None:
        for e in np.flatnonzero(~episode_end & np.any([m.any(-1) for m in agent_end.values()], 0)):
            ended = {g: m[e] for g, m in agent_end.items() if m[e].any()}
            infos[e]["episode"] = {
                "return": {g: float(self.returns[g][e][m].mean()) for g, m in ended.items()},
                "length": int(np.mean(np.concatenate([self.agent_length[g][e][m] for g, m in ended.items()]))),
            }
            for g, m in ended.items():
                self.returns[g][e][m] = 0.0
                self.seen[g][e][m] = False
                self.agent_length[g][e][m] = 0

    def _envs_ended(self, infos: list[dict], episode_end: np.ndarray) -> None:
        for e in np.flatnonzero(episode_end):
            infos[e]["episode"] = {
                "return": {g: float(self.returns[g][e][self.seen[g][e]].mean()) if self.seen[g][e].any() else 0.0
                           for g in self.returns},
                "length": int(self.length[e]),
            }
            for g in self.returns:
                self.returns[g][e] = 0.0
                self.seen[g][e] = False
                self.agent_length[g][e] = 0
            self.length[e] = 0

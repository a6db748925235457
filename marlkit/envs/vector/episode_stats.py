"""Episode statistics: per-env running returns and lengths, reported as ``info["episode"]`` when an
episode ends, counted by a wrapper around any vector env backend."""
from __future__ import annotations

import copy
import pickle

import numpy as np

from marlkit.envs.core import EnvSpec, Observation, StepResult, group_arrays


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

    def rows(self, first: int, count: int, view: bool = False) -> "EpisodeStats":
        """The accumulators of envs ``first .. first + count - 1``: copies, for a worker of those
        envs, or with ``view`` views, which count into these."""
        part = slice(first, first + count)
        block = copy.copy(self)
        for name in self.PER_GROUP:
            setattr(block, name, {g: v[part] if view else v[part].copy() for g, v in getattr(self, name).items()})
        block.length = self.length[part] if view else self.length[part].copy()
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


class EpisodeStatistics:
    """A vector env whose ``infos[e]["episode"]`` holds, beside the env's own ``stats``, the
    episode's ``return`` per group and its ``length`` (``EpisodeStats``), counted here around the
    backend ``venv``. Everything else is the backend's.

    Where the backend's env workers host jobs that step their envs themselves (``install_jobs``:
    the workers act), each worker counts its block with a wrapper of its own, handed the rows of
    the accumulators; a saved state gathers them back, so the saved format is one whatever steps
    the envs: a run may resume with another vectorisation or worker count."""

    def __init__(self, venv=None):
        self.venv = venv
        self.stats: EpisodeStats | None = None
        self.acting: dict[str, np.ndarray] | None = None   # per group, the agents acting at the step to come
        self.delegated = False     # the backend's workers count (they host jobs)

    def __getattr__(self, name):
        if name == "venv":   # not yet set (unpickling)
            raise AttributeError(name)
        return getattr(self.venv, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def restarts(self) -> int:
        return self.venv.restarts

    def reset(self, seed: int | None = None) -> Observation:
        obs = self.venv.reset(seed=seed)
        self.stats = EpisodeStats(self.venv.spec, self.venv.num_envs)
        self.acting = obs.agent_mask
        return obs

    def step(self, actions: dict[str, np.ndarray]) -> StepResult:
        result = self.venv.step(actions)
        self._count(result, self.stats, self.acting)
        self.acting = result.next.agent_mask
        return result

    def step_async(self, actions: dict[str, np.ndarray], envs: tuple[int, int]) -> None:
        """The backend's: start stepping envs ``envs`` = (first, count) alone."""
        self.venv.step_async(actions, envs)

    def step_wait(self, envs: tuple[int, int]) -> StepResult:
        """The backend's result of envs ``envs``, their episodes counted."""
        result = self.venv.step_wait(envs)
        first, count = envs
        rows = slice(first, first + count)
        self._count(result, self.stats.rows(first, count, view=True), {g: m[rows] for g, m in self.acting.items()})
        # a new dict of new arrays: the old ones are the collector's agent masks too
        self.acting = {g: m.copy() for g, m in self.acting.items()}
        for g, m in self.acting.items():
            m[rows] = result.next.agent_mask[g]
        return result

    @staticmethod
    def _count(result: StepResult, stats: EpisodeStats, acting: dict) -> None:
        """Count ``result``'s rewards in ``stats`` (the accumulators of its envs) and report the
        episodes that ended in its infos."""
        stats.add(acting, result.reward)
        if result.episode_end.any() or any(m.any() for m in result.agent_end.values()):
            for e, info in enumerate(stats.ended(result.episode_end, result.agent_end)):
                if info:
                    result.infos[e]["episode"] = {**info["episode"], **result.infos[e].get("episode", {})}
        if result.lost is not None:   # a cut episode is no episode: its return would be partial
            for e in np.flatnonzero(result.lost):
                result.infos[e].pop("episode", None)

    # ------------------------------------------------------------------ workers that count

    def around(self, venv) -> "EpisodeStatistics":
        """This wrapper (rows of accumulators, from ``rows``) around ``venv``: a worker's envs."""
        self.venv = venv
        return self

    def rows(self, first: int, count: int) -> "EpisodeStatistics":
        """A wrapper of no env yet, holding the accumulators of envs ``first .. first + count - 1``."""
        part = EpisodeStatistics()
        part.stats = self.stats.rows(first, count)
        part.acting = {g: m[first:first + count] for g, m in self.acting.items()}
        return part

    def accumulators(self) -> tuple:
        return self.stats, self.acting

    def load_accumulators(self, accumulators: tuple) -> None:
        self.stats, self.acting = accumulators

    def install_jobs(self, jobs: list) -> None:
        """The backend's ``install_jobs``, each worker counting its block from now on."""
        self.venv.install_jobs(jobs, [self.rows(first, count) for first, count in self.venv.blocks])
        self.delegated = True

    # ------------------------------------------------------------------ saved state

    def get_state(self) -> bytes | None:
        """Every env (one blob each, in env order) and the episode accumulators, for an exact
        resume; None when an env cannot be pickled."""
        envs = self.venv.env_states()
        if any(blob is None for blob in envs):
            return None
        if self.delegated:
            parts = self.venv.hosted_accumulators()
            self.stats = EpisodeStats.join([stats for stats, _ in parts])
            self.acting = {g: np.concatenate([acting[g] for _, acting in parts]) for g in parts[0][1]}
        return pickle.dumps({"envs": envs, "stats": self.stats, "acting": self.acting})

    def set_state(self, blob: bytes) -> None:
        state = pickle.loads(blob)
        if len(state["envs"]) != self.venv.num_envs:
            raise ValueError(f"the saved state holds {len(state['envs'])} envs, this vector env has "
                             f"{self.venv.num_envs}; resume with the same runner.parallels")
        self.venv.load_env_states(state["envs"])
        self.stats, self.acting = state["stats"], state["acting"]
        if self.delegated:
            self.venv.load_hosted_accumulators([self.rows(first, count).accumulators()
                                                for first, count in self.venv.blocks])

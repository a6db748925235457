"""Episode statistics: per-env running returns and lengths, reported as ``info["episode"]`` when an
episode ends, counted by a wrapper around any vector env backend."""
from __future__ import annotations

import copy
import pickle

import numpy as np

from marlkit.envs.core import EnvSpec, Observation, StepResult, group_arrays
from marlkit.envs.vector.base import VectorEnv, WorkerVectorEnv


class EpisodeCounter:
    """Per-env running returns; on episode end, per group the mean over agents of their return
    (agents never present in the episode are left out) and the episode length. Agents whose own
    episode ends while the env goes on (``agent_end``) report theirs at once: per group the mean
    over those agents, only for the groups they belong to, and their mean length in env steps.
    Each ended episode also reports per group the mean of its ended agents' rewards at that last
    step (``final_reward``: a match's outcome, where a scene pays the winner at the end).
    ``acting``: per group ``[E, A_g]``, the agents acting at the step to come."""

    PER_GROUP = ("returns", "seen", "agent_length", "acting")   # kept per group, [E, A_g] each

    def __init__(self, spec: EnvSpec, acting: dict[str, np.ndarray]):
        num_envs = len(next(iter(acting.values())))
        self.returns = group_arrays(spec, np.float64, (num_envs,))
        self.seen = group_arrays(spec, bool, (num_envs,))
        self.length = np.zeros(num_envs, np.int64)
        self.agent_length = group_arrays(spec, np.int64, (num_envs,))
        self.acting = acting
        self.step_reward: dict = {}   # the last step's rewards, for ``ended`` (not carried: it reads them at once)

    def add(self, reward: dict) -> None:
        """One step's rewards. Every reward counts, also one that reaches an agent between two of
        its decisions (Unity); an agent that does not act and gets no reward adds 0."""
        self.length += 1
        self.step_reward = reward
        for g, returns in self.returns.items():
            returns += reward[g]
            self.seen[g] |= self.acting[g]
            self.agent_length[g] += 1

    def rows(self, first: int, count: int, view: bool = False) -> "EpisodeCounter":
        """The counter of envs ``first .. first + count - 1``: copies, for a worker of those envs,
        or with ``view`` views, which count into this one."""
        part = slice(first, first + count)
        block = copy.copy(self)
        for name in self.PER_GROUP:
            setattr(block, name, {g: v[part] if view else v[part].copy() for g, v in getattr(self, name).items()})
        block.length = self.length[part] if view else self.length[part].copy()
        return block

    @staticmethod
    def join(parts: list["EpisodeCounter"]) -> "EpisodeCounter":
        """The counters of consecutive blocks of envs, in env order, as one."""
        whole = copy.copy(parts[0])
        for name in EpisodeCounter.PER_GROUP:
            setattr(whole, name, {g: np.concatenate([getattr(p, name)[g] for p in parts])
                                  for g in getattr(parts[0], name)})
        whole.length = np.concatenate([p.length for p in parts])
        return whole

    def state_dict(self) -> dict:
        """The counts as plain arrays: ``length`` ``[E]`` and, per group, the ``PER_GROUP`` ones."""
        return {"length": self.length, **{name: getattr(self, name) for name in self.PER_GROUP}}

    @classmethod
    def from_state_dict(cls, state: dict) -> "EpisodeCounter":
        counter = cls.__new__(cls)
        for name, value in state.items():
            setattr(counter, name, value)
        return counter

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
                "final_reward": {g: float(np.mean(self.step_reward[g][e][m])) for g, m in ended.items()
                                 if g in self.step_reward},
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
                "final_reward": {g: float(self.step_reward[g][e][self.seen[g][e]].mean())
                                 for g in self.returns if g in self.step_reward and self.seen[g][e].any()},
                "length": int(self.length[e]),
            }
            for g in self.returns:
                self.returns[g][e] = 0.0
                self.seen[g][e] = False
                self.agent_length[g][e] = 0
            self.length[e] = 0


class EpisodeStatistics:
    """A vector env whose ``infos[e]["episode"]`` holds, beside the env's own ``stats``, the
    episode's ``return`` per group and its ``length`` (``EpisodeCounter``), counted here around the
    backend ``venv``. What it does not add to, it hands to the backend, one name at a time; what
    only a backend with env workers can do (``WorkerVectorEnv``) it hands on where ``in_workers``.

    Where the backend's env workers host jobs that step their envs themselves (``install_jobs``:
    the workers act), each worker counts its block with a wrapper of its own, handed the rows of
    the counter; a saved state gathers them back, so the saved format is one whatever steps the
    envs: a run may resume with another vectorisation or worker count."""

    def __init__(self, venv: VectorEnv | None = None):
        self.venv = venv
        self.counter: EpisodeCounter | None = None
        self.delegated = False     # the backend's workers count (they host jobs)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ the backend's

    @property
    def spec(self) -> EnvSpec:
        return self.venv.spec

    @property
    def num_envs(self) -> int:
        return self.venv.num_envs

    @property
    def restarts(self) -> int:
        return self.venv.restarts

    def render(self, index: int = 0):
        return self.venv.render(index)

    def log_to(self, run_dir) -> None:
        self.venv.log_to(run_dir)

    def close(self) -> None:
        self.venv.close()

    @property
    def in_workers(self) -> bool:
        """Whether the envs live in worker processes (``WorkerVectorEnv``): they can step in parts
        and host jobs."""
        return isinstance(self.venv, WorkerVectorEnv)

    @property
    def workers(self) -> WorkerVectorEnv:
        """The backend, where ``in_workers``."""
        if not self.in_workers:
            raise TypeError(f"{type(self.venv).__name__} holds no env workers (not a WorkerVectorEnv)")
        return self.venv

    @property
    def blocks(self) -> list[tuple[int, int]]:
        return self.workers.blocks

    def splits(self, n: int) -> list[tuple[int, int]]:
        return self.workers.splits(n)

    def run_jobs(self, args: list, what: str) -> list:
        return self.workers.run_jobs(args, what)

    # ------------------------------------------------------------------ stepping, counted

    def reset(self, seed: int | None = None) -> Observation:
        obs = self.venv.reset(seed=seed)
        self.counter = EpisodeCounter(self.venv.spec, obs.agent_mask)
        return obs

    def step(self, actions: dict[str, np.ndarray]) -> StepResult:
        result = self.venv.step(actions)
        self._count(result, self.counter)
        self.counter.acting = result.next.agent_mask
        return result

    def step_async(self, actions: dict[str, np.ndarray], envs: tuple[int, int]) -> None:
        """Start stepping envs ``envs`` = (first, count) alone."""
        self.workers.step_async(actions, envs)

    def step_wait(self, envs: tuple[int, int]) -> StepResult:
        """The result of envs ``envs``, their episodes counted."""
        result = self.workers.step_wait(envs)
        first, count = envs
        self._count(result, self.counter.rows(first, count, view=True))
        # a new dict of new arrays: the old ones are the collector's agent masks too
        acting = {g: m.copy() for g, m in self.counter.acting.items()}
        for g, m in acting.items():
            m[first:first + count] = result.next.agent_mask[g]
        self.counter.acting = acting
        return result

    @staticmethod
    def _count(result: StepResult, counter: EpisodeCounter) -> None:
        """Count ``result``'s rewards in ``counter`` (that of its envs) and report the episodes that
        ended in its infos."""
        counter.add(result.reward)
        if result.episode_end.any() or any(m.any() for m in result.agent_end.values()):
            for e, info in enumerate(counter.ended(result.episode_end, result.agent_end)):
                if info:
                    result.infos[e]["episode"] = {**info["episode"], **result.infos[e].get("episode", {})}
        if result.lost is not None:   # a cut episode is no episode: its return would be partial
            for e in np.flatnonzero(result.lost):
                result.infos[e].pop("episode", None)

    # ------------------------------------------------------------------ workers that count

    def around(self, venv: VectorEnv) -> "EpisodeStatistics":
        """This wrapper (the rows of a counter, from ``rows``) around ``venv``: a worker's envs."""
        self.venv = venv
        return self

    def rows(self, first: int, count: int) -> "EpisodeStatistics":
        """A wrapper of no env yet, holding the counter of envs ``first .. first + count - 1``."""
        part = EpisodeStatistics()
        part.counter = self.counter.rows(first, count)
        return part

    def install_jobs(self, jobs: list) -> None:
        """The backend's ``install_jobs``, each worker counting its block from now on."""
        self.workers.install_jobs(jobs, [self.rows(first, count) for first, count in self.blocks])
        self.delegated = True

    # ------------------------------------------------------------------ saved state

    def state_dict(self) -> bytes | None:
        """Every env (one blob each, in env order) and the episode counter, for an exact resume;
        None when an env cannot be pickled."""
        envs = self.venv.state_dict()
        if any(blob is None for blob in envs):
            return None
        if self.delegated:
            self.counter = EpisodeCounter.join(self.workers.hosted_counters())
        return pickle.dumps({"envs": envs, "counter": self.counter.state_dict()})

    def load_state_dict(self, blob: bytes) -> bool:
        """The envs and the episode counter of ``state_dict``; False, with nothing restored, where
        the envs' blobs do not fit today's envs."""
        state = pickle.loads(blob)
        if len(state["envs"]) != self.venv.num_envs:
            raise ValueError(f"the saved state holds {len(state['envs'])} envs, this vector env has "
                             f"{self.venv.num_envs}; resume with the same runner.parallels")
        if not self.venv.load_state_dict(state["envs"]):
            return False
        self.counter = EpisodeCounter.from_state_dict(state["counter"])
        if self.delegated:
            self.workers.load_hosted_counters([self.counter.rows(first, count) for first, count in self.blocks])
        return True

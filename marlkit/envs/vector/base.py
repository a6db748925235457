"""What every vector env shares: auto-reset bookkeeping, episode statistics, saved state."""
from __future__ import annotations

import atexit
import pickle
import weakref

import numpy as np

from marlkit.envs.core import EnvSpec, Observation, StepResult
from marlkit.envs.vector.arrays import _Arrays
from marlkit.envs.vector.episode_stats import EpisodeStats

# vector envs with processes of their own, closed at interpreter exit if nobody closed them
_LIVE: "weakref.WeakSet[VectorEnv]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for venv in list(_LIVE):
        venv.close()


class VectorEnv:
    spec: EnvSpec
    num_envs: int
    restarts = 0   # workers replaced after a loss (backends that restart them)

    def __init__(self):
        self._acting: dict | None = None

    def _finish(self, arrays: _Arrays, env_stats: dict[int, dict]) -> StepResult:
        """``env_stats``: env index -> ``episode_stats()`` of the envs whose episode ended."""
        reward = arrays.group("reward")
        episode_end = arrays.a["episode_end"].copy()
        agent_end = arrays.group("agent_end")
        next_ob = arrays.observation("next")
        self.stats.add(self._acting, reward)
        # on most steps nothing ends: no episode bookkeeping, and the final observation is the next one
        if arrays.a["any_end"].any():
            infos, final = self.stats.ended(episode_end, agent_end), arrays.observation("final")
        else:
            infos, final = [{} for _ in range(self.num_envs)], next_ob
        for e, stats in env_stats.items():
            if stats:
                infos[e]["episode"]["stats"] = stats
        result = StepResult(next_ob, reward, arrays.group("terminated"), arrays.group("truncated"), episode_end,
                            final, infos, agent_end)
        self._acting = result.next.agent_mask
        return result

    def _start(self, obs: Observation) -> Observation:
        self.stats = EpisodeStats(self.spec, self.num_envs)
        self._acting = obs.agent_mask
        return obs

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def reset(self, seed: int | None = None) -> Observation:
        raise NotImplementedError

    def step(self, actions: dict[str, np.ndarray]) -> StepResult:
        raise NotImplementedError

    def render(self, index: int = 0):
        raise NotImplementedError

    def get_state(self) -> bytes | None:
        """Every env (one blob each, in env order) and the episode accumulators, for an exact
        resume; None when an env cannot be pickled. The same format for every vector env, so a
        run may resume with another vectorisation or worker count."""
        envs, stats, acting = self._saved()
        if any(blob is None for blob in envs):
            return None
        return pickle.dumps({"envs": envs, "stats": stats, "acting": acting})

    def set_state(self, blob: bytes) -> None:
        state = pickle.loads(blob)
        if len(state["envs"]) != self.num_envs:
            raise ValueError(f"the saved state holds {len(state['envs'])} envs, this vector env has {self.num_envs}; "
                             "resume with the same runner.parallels")
        self._restore(state["envs"], state["stats"], state["acting"])

    def _saved(self) -> tuple[list[bytes | None], EpisodeStats, dict[str, np.ndarray]]:
        """-> every env's state blob, in env order, and the episode accumulators (``stats``, and
        per group which agents acted in each env's episode so far)."""
        return self._env_states(), self.stats, self._acting

    def _restore(self, blobs: list[bytes], stats: EpisodeStats, acting: dict[str, np.ndarray]) -> None:
        """The inverse of ``_saved``."""
        self.stats, self._acting = stats, acting
        self._load_env_states(blobs)

    def _env_states(self) -> list[bytes | None]:
        raise NotImplementedError

    def _load_env_states(self, blobs: list[bytes]) -> None:
        raise NotImplementedError

    def log_to(self, run_dir) -> None:
        """Where a backend with messages of its own (Ray's) writes them: the run's directory."""

    def close(self) -> None:
        raise NotImplementedError


def _seeds(seed: int | None, n: int, offset: int = 0) -> list[int | None]:
    return [None if seed is None else seed + offset + i for i in range(n)]


def _seeds(seed: int | None, n: int, offset: int = 0) -> list[int | None]:
    return [None if seed is None else seed + offset + i for i in range(n)]

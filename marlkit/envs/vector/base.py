"""What every vector env backend shares: the step's result out of its arrays, closing at exit."""
from __future__ import annotations

import atexit
import weakref

import numpy as np

from marlkit.envs.core import EnvSpec, Observation, StepResult
from marlkit.envs.vector.arrays import _Arrays

# vector envs with processes of their own, closed at interpreter exit if nobody closed them
_LIVE: "weakref.WeakSet[VectorEnv]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for venv in list(_LIVE):
        venv.close()


class VectorEnv:
    """A backend: E envs stepped as one, with auto-reset. ``step`` reports in ``infos[e]["episode"]``
    only the env's own ``episode_stats()`` (``{"stats": ...}``) when its episode ends; returns and
    lengths are counted around it by ``EpisodeStatistics`` (``episode_stats.py``), which the
    vector-env constructors put around every backend."""

    spec: EnvSpec
    num_envs: int
    restarts = 0   # workers replaced after a loss (backends that restart them)

    def _finish(self, arrays: _Arrays, env_stats: dict[int, dict], first: int = 0, count: int | None = None) -> StepResult:
        """``env_stats``: env index -> ``episode_stats()`` of the envs whose episode ended. The result
        is that of envs ``first .. first + count - 1`` (all envs by default), indexed from 0."""
        count = self.num_envs - first if count is None else count
        rows = slice(first, first + count)
        infos: list[dict] = [{} for _ in range(count)]
        for e, stats in env_stats.items():
            if stats:
                infos[e - first]["episode"] = {"stats": stats}
        next_ob = arrays.observation("next", rows)
        # on most steps nothing ends, and the final observation is the next one
        final = arrays.observation("final", rows) if arrays.a["any_end"][rows].any() else next_ob
        return StepResult(next_ob, arrays.group("reward", rows), arrays.group("terminated", rows),
                          arrays.group("truncated", rows), arrays.a["episode_end"][rows].copy(), final, infos,
                          arrays.group("agent_end", rows))

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

    def env_states(self) -> list[bytes | None]:
        """Every env's state blob (None: it cannot be pickled), in env order."""
        raise NotImplementedError

    def load_env_states(self, blobs: list[bytes]) -> None:
        """The inverse of ``env_states``."""
        raise NotImplementedError

    def log_to(self, run_dir) -> None:
        """Where a backend with messages of its own (Ray's) writes them: the run's directory."""

    def close(self) -> None:
        raise NotImplementedError


def _seeds(seed: int | None, n: int, offset: int = 0) -> list[int | None]:
    return [None if seed is None else seed + offset + i for i in range(n)]

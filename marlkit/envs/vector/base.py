"""What every vector env backend shares, and what a backend whose envs live in worker processes
declares it can do beyond stepping them all at once."""
from __future__ import annotations

import atexit
import weakref

import numpy as np

from marlkit.envs.core import EnvSpec, Observation, StepResult
from marlkit.envs.vector.arrays import StepArrays

# vector envs with processes of their own, closed at interpreter exit if nobody closed them
OPEN_VECTOR_ENVS: "weakref.WeakSet[VectorEnv]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for venv in list(OPEN_VECTOR_ENVS):
        venv.close()


class VectorEnv:
    """A backend: E envs stepped as one, with auto-reset. ``step`` reports in ``infos[e]["episode"]``
    only the env's own ``episode_stats()`` (``{"stats": ...}``) when its episode ends; returns and
    lengths are counted around it by ``EpisodeStatistics`` (``episode_stats.py``), which the
    vector-env constructors put around every backend."""

    spec: EnvSpec
    num_envs: int
    restarts = 0   # workers replaced after a loss (backends that restart them)

    def _finish(self, arrays: StepArrays, env_stats: dict[int, dict], first: int = 0,
                count: int | None = None) -> StepResult:
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

    def state_dict(self) -> list[bytes | None]:
        """Every env's state blob (None: it cannot be pickled), in env order."""
        raise NotImplementedError

    def load_state_dict(self, blobs: list[bytes]) -> bool:
        """The inverse of ``state_dict``; False where the blobs do not fit today's envs (written by
        other code), which are then left as they were."""
        raise NotImplementedError

    def log_to(self, run_dir) -> None:
        """Where a backend with messages of its own (Ray's) writes them: the run's directory."""

    def close(self) -> None:
        raise NotImplementedError


class WorkerVectorEnv(VectorEnv):
    """A backend whose envs live in worker processes, each hosting a block of consecutive envs
    (``blocks``). Beyond stepping every env at once it can

    - step the envs of some workers while others wait (``splits``, ``step_async``, ``step_wait``):
      double-buffered collection;
    - run a job in each worker on that worker's own envs (``install_jobs``, ``run_jobs``), which
      steps them there: the workers acting, with no round trip per step;
    - hand over the episode counters its jobs keep (``hosted_counters``), for a checkpoint.

    The envs layer knows nothing of what a job does."""

    @property
    def blocks(self) -> list[tuple[int, int]]:
        """Per worker, (its first env, how many envs it hosts): consecutive blocks in env order."""
        raise NotImplementedError

    def splits(self, n: int) -> list[tuple[int, int]]:
        """The envs in ``n`` parts of whole workers, as (first env, count)."""
        raise NotImplementedError

    def step_async(self, actions: dict[str, np.ndarray], envs: tuple[int, int] | None = None) -> None:
        """Start stepping the envs ``envs`` = (first, count), whole workers' (all: None), with
        ``actions`` ``[count, A_g, ...]``."""
        raise NotImplementedError

    def step_wait(self, envs: tuple[int, int] | None = None) -> StepResult:
        """The result of the step ``step_async(..., envs)`` started, for those envs (indexed from 0)."""
        raise NotImplementedError

    def install_jobs(self, jobs: list, counting: list | None = None) -> None:
        """Give each worker a job (``jobs[w]`` for the envs of ``blocks[w]``): ``job.install(venv)``
        once, with the worker's envs as a vector env of their own, then ``job.run(arg)`` per
        ``run_jobs``. ``counting[w]``: the episode statistics (``EpisodeStatistics.rows``) the worker
        puts around its vector env, and keeps from now on."""
        raise NotImplementedError

    def run_jobs(self, args: list, what: str) -> list:
        """``job.run(args[w])`` in every worker at once -> their results, in worker order."""
        raise NotImplementedError

    def hosted_counters(self) -> list:
        """Per worker hosting a job, the episode counter of its envs (``counting``)."""
        raise NotImplementedError

    def load_hosted_counters(self, counters: list) -> None:
        """The inverse of ``hosted_counters``."""
        raise NotImplementedError


def env_seeds(seed: int | None, n: int, offset: int = 0) -> list[int | None]:
    """The seeds of ``n`` envs numbered from ``offset``: env ``i`` is reset with ``seed + i``."""
    return [None if seed is None else seed + offset + i for i in range(n)]

"""Vector envs: E copies of a :class:`MultiAgentEnv`, batched to ``[E, A_g, ...]``, with auto-reset.

One idea per module: ``arrays`` (the step's arrays, shared memory), ``state`` (env state for an
exact resume), ``base`` (what every backend shares, and what one with env workers can do beside),
the backends ``sync`` (in this process), ``subprocess`` (worker processes, which also run jobs on
their own envs: the runner's acting, ``runner.act_in_workers``) and ``ray`` (Ray actors, anywhere
in a cluster; joining one is ``marlkit/envs/ray_cluster.py``'s). ``episode_stats`` counts episode
returns and lengths in a wrapper that the constructors put around whichever backend.
"""
from __future__ import annotations

import functools
from typing import Callable

from marlkit.envs.core import MultiAgentEnv
from marlkit.envs.vector.arrays import StepArrays, action_shapes
from marlkit.envs.vector.base import OPEN_VECTOR_ENVS, VectorEnv, WorkerVectorEnv, env_seeds
from marlkit.envs.vector.episode_stats import EpisodeCounter, EpisodeStatistics
from marlkit.envs.vector.state import dumps_state
from marlkit.envs.vector.subprocess import SubprocVectorEnv, resolve_start_method
from marlkit.envs.vector.sync import SyncVectorEnv

__all__ = ["OPEN_VECTOR_ENVS", "EpisodeCounter", "EpisodeStatistics", "StepArrays", "SubprocVectorEnv", "SyncVectorEnv",
           "VectorEnv", "WorkerVectorEnv", "action_shapes", "dumps_state", "env_seeds", "make_vector_env",
           "resolve_start_method"]


def make_vector_env(env_fn: Callable[[int], MultiAgentEnv], num_envs: int, vectorize: str = "sync",
                    num_workers: int | None = None, timeout: float = 60.0, start_method: str = "auto",
                    start_timeout: float = 120.0, first_index: int = 0, align: int = 1) -> EpisodeStatistics:
    """``env_fn(first_index + i)`` builds env ``i``; it must be picklable for
    ``vectorize='subprocess'``, whose workers hold whole blocks of ``align`` envs. ``'auto'`` is
    ``'subprocess'`` for two envs or more and ``'sync'`` for one, for envs whose own process already
    isolates the work and answers within a timeout (Unity): a worker for a single env only adds a
    round trip per step. The backend comes wrapped in ``EpisodeStatistics``."""
    fns = [functools.partial(env_fn, first_index + i) for i in range(num_envs)]
    if vectorize == "auto":
        vectorize = "subprocess" if num_envs > 1 else "sync"
    if vectorize == "sync":
        return EpisodeStatistics(SyncVectorEnv(fns))
    if vectorize == "subprocess":
        return EpisodeStatistics(SubprocVectorEnv(fns, num_workers, timeout, start_method, start_timeout, align))
    raise ValueError(f"runner.vectorize: unknown {vectorize!r}; choose 'sync', 'subprocess' or 'auto'")

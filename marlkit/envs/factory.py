"""Build envs from an env config: the one place that maps ``env.type`` to an adapter."""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from marlkit.config import EnvConfig, RunnerConfig
from marlkit.envs.core import MultiAgentEnv
from marlkit.envs.vector import EpisodeStatistics, make_vector_env
from marlkit.envs.wrappers import wrap
from marlkit.registry import get_env_type


def make_env(cfg: EnvConfig, render: bool = False, index: int = 0) -> MultiAgentEnv:
    """Env ``index`` of a vector env: adapters that start processes derive their ports and worker
    ids from it, so that the envs of one run (and of overlapping runs) never collide."""
    return wrap(get_env_type(cfg.type).from_config(cfg, render=render, index=index), cfg)


@dataclass
class _EnvBuilder:
    """Picklable ``i -> env`` for subprocess workers. It remembers the module that registered the
    env type, so that a user's own adapter is registered in a fresh worker process too."""

    cfg: EnvConfig
    render: bool = False
    module: str = ""

    def __post_init__(self):
        if not self.module:
            self.module = get_env_type(self.cfg.type).__module__

    def __call__(self, index: int) -> MultiAgentEnv:
        if self.module != "__main__":
            importlib.import_module(self.module)
        return make_env(self.cfg, render=self.render, index=index)


def make_env_vector(cfg: EnvConfig, rc: RunnerConfig, num_envs: int | None = None,
                    render: bool = False, first_index: int = 0) -> EpisodeStatistics:
    """``first_index``: the index of the first env, so that two vector envs open at once (training
    and evaluation) hand their envs distinct indices, hence distinct fixed ports and worker ids. An
    env type whose envs come as one batch (``batched``) builds the vector env itself."""
    env_type = get_env_type(cfg.type)
    if env_type.batched:
        return EpisodeStatistics(env_type.vector_env(cfg, num_envs or rc.parallels, render, first_index))
    if rc.vectorize == "ray":
        from marlkit.envs.vector.ray import make_ray_vector_env
        return make_ray_vector_env(_EnvBuilder(cfg, render), num_envs or rc.parallels, rc.workers,
                                   rc.ray_cpus_per_worker, rc.ray_address, rc.worker_timeout,
                                   rc.worker_start_timeout, rc.ray_max_restarts, first_index)
    return make_vector_env(_EnvBuilder(cfg, render), num_envs or rc.parallels, rc.vectorize,
                           rc.workers, rc.worker_timeout, rc.start_method,
                           rc.worker_start_timeout, first_index, rc.act_batch or 1)

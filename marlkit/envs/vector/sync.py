"""All envs of a vector in this process."""
from __future__ import annotations

from typing import Callable

import numpy as np

from marlkit.envs.core import MultiAgentEnv, Observation, StepResult
from marlkit.envs.vector.arrays import StepArrays, action_shapes
from marlkit.envs.vector.base import VectorEnv, env_seeds
from marlkit.envs.vector.state import dumps_state, loads_states

EnvFactory = Callable[[], MultiAgentEnv]


class SyncVectorEnv(VectorEnv):
    """All envs in this process; the fastest choice for cheap envs such as MPE."""

    def __init__(self, env_fns: list[EnvFactory]):
        self.envs = []
        try:
            for fn in env_fns:
                self.envs.append(fn())
        except BaseException:
            self.close()
            raise
        self._set_up()

    @classmethod
    def hosting(cls, envs: list[MultiAgentEnv], on_env: Callable[[int | None], None]) -> "SyncVectorEnv":
        """A vector env over envs built already (an env worker's, for a job it runs on them);
        ``on_env(i)`` is called before env ``i`` steps, and ``on_env(None)`` after the last."""
        venv = cls.__new__(cls)
        venv.envs = envs
        venv._set_up(on_env)
        return venv

    def _set_up(self, on_env: Callable[[int | None], None] | None = None) -> None:
        self.spec = self.envs[0].spec
        self.num_envs = len(self.envs)
        self.arrays = StepArrays(self.spec, self.num_envs, action_shapes(self.spec))
        self._on_env = on_env

    def reset(self, seed: int | None = None) -> Observation:
        for e, (env, s) in enumerate(zip(self.envs, env_seeds(seed, self.num_envs))):
            self.arrays.write_obs("next", e, env.reset(seed=s))
        return self.arrays.observation("next")

    def step(self, actions: dict[str, np.ndarray]) -> StepResult:
        ended = {}
        on_env = self._on_env
        for e, env in enumerate(self.envs):
            if on_env is not None:
                on_env(e)
            ob, reward, terminated, truncated, done = env.step({g: a[e] for g, a in actions.items()})
            if done:
                ended[e] = env.episode_stats()
            self.arrays.write_step(e, ob, reward, terminated, truncated, done, env.reset() if done else None)
        if on_env is not None:
            on_env(None)
        return self._finish(self.arrays, ended)

    def render(self, index: int = 0):
        return self.envs[index].render()

    def state_dict(self) -> list[bytes | None]:
        return [dumps_state(env) for env in self.envs]

    def load_state_dict(self, blobs: list[bytes]) -> bool:
        self.envs, restored = loads_states(self.envs, blobs)
        return restored

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs = []

"""Env adapters and vector envs. Nothing here knows about agents."""
from marlkit.envs.core import (EnvAPIError, EnvSpec, EnvWorkerError, GroupSpec, MultiAgentEnv, Observation,
                               StepResult)
from marlkit.envs.factory import make_env, make_env_vector
from marlkit.envs.pettingzoo import PettingZooEnv
from marlkit.envs import doom  # noqa: F401  (registers env.type 'doom'; vizdoom is imported lazily)
from marlkit.envs import unity  # noqa: F401  (registers env.type 'unity'; mlagents-envs is imported lazily)
from marlkit.envs import gymma  # noqa: F401  (registers env.type 'gymma'; the env's module is imported lazily)
from marlkit.envs import vmas  # noqa: F401  (registers env.type 'vmas'; vmas is imported lazily)
from marlkit.envs.vector import SubprocVectorEnv, SyncVectorEnv, VectorEnv

__all__ = ["EnvAPIError", "EnvSpec", "EnvWorkerError", "GroupSpec", "MultiAgentEnv", "Observation",
           "StepResult", "PettingZooEnv", "SubprocVectorEnv", "SyncVectorEnv", "VectorEnv", "make_env",
           "make_env_vector"]

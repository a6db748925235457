"""Unity ML-Agents: the env adapter (``env.type: unity``) and the install helper for mlagents-envs
on Python 3.11 (``protos``). mlagents-envs is imported only when a unity env is built."""
from marlkit.envs.unity.env import UnityConfig, UnityEnv

__all__ = ["UnityConfig", "UnityEnv"]

"""marlkit: cooperative and competitive multi-agent RL on PettingZoo, ViZDoom and Unity envs."""
__version__ = "0.1.0"

from marlkit.registry import REGISTRY, register_agent, register_env, register_model  # noqa: E402

__all__ = ["REGISTRY", "build_config", "register_agent", "register_env", "register_model", "run", "__version__"]


def __getattr__(name):
    # Lazy, so that importing marlkit.envs in an env worker process does not pull in torch.
    if name in ("run", "build_config"):
        from marlkit import api
        return getattr(api, name)
    raise AttributeError(f"module 'marlkit' has no attribute {name!r}")

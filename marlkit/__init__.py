"""marlkit: cooperative and competitive multi-agent RL on PettingZoo, ViZDoom and Unity envs."""
__version__ = "0.1.0"

from marlkit.api import build_config, run  # noqa: E402
from marlkit.registry import REGISTRY, register_agent, register_env, register_model  # noqa: E402

__all__ = ["REGISTRY", "build_config", "register_agent", "register_env", "register_model", "run", "__version__"]

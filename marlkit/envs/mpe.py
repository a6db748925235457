"""MPE scenarios from ``mpe2``, the embedded default workload.

``mpe_spread`` needs nothing beyond the YAML (``env.factory: mpe2.simple_spread_v3:parallel_env``);
this module only gives a clear message when mpe2 is missing.
"""
from __future__ import annotations

import importlib


def parallel_env(scenario: str = "simple_spread_v3", **kwargs):
    """``env.factory: marlkit.envs.mpe:parallel_env`` with ``kwargs: {scenario: simple_tag_v3, ...}``."""
    try:
        module = importlib.import_module(f"mpe2.{scenario}")
    except ModuleNotFoundError as exc:
        if exc.name == "mpe2":
            raise ImportError("the MPE envs need mpe2: pip install mpe2") from None
        raise ImportError(f"mpe2 has no scenario {scenario!r}") from None
    return module.parallel_env(**kwargs)

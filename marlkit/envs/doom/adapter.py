"""``env.type: doom``: the co-op ParallelEnv through the PettingZoo adapter, one match per env index."""
from __future__ import annotations

import numpy as np

from marlkit.envs.doom.config import DoomConfig
from marlkit.envs.doom.parallel_env import DoomCoopEnv
from marlkit.envs.pettingzoo import PettingZooEnv
from marlkit.registry import register_env


@register_env("doom")
class DoomEnv(PettingZooEnv):
    """One group ``agents`` of ``player_0..N-1``; ``state`` is the env's own (``env.state``)."""

    config_cls = DoomConfig

    @classmethod
    def from_config(cls, cfg: DoomConfig, render: bool = False, index: int = 0) -> "DoomEnv":
        return cls(DoomCoopEnv(cfg, index=index, render_mode="rgb_array" if render else None),
                   groups=cfg.groups, max_episode_steps=cfg.max_episode_steps)

    def __init__(self, env: DoomCoopEnv, **kwargs):
        super().__init__(env, state="env", **kwargs)
        self.spec.state_dtype = np.dtype(env.state_space.dtype)
        # screens are [C, H, W], and so is the "screens" state: said, not left to a guess from the shape
        self.spec.state_channels_last = False if len(self.spec.state_shape) == 3 else None
        for gs in self.spec.groups.values():
            gs.channels_last = False

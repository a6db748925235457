"""What the runner, envs and agents agree on about an env's agent groups and spaces.

Kept apart from ``marlkit.envs`` and ``marlkit.agents`` so that neither has to import the other.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces


def action_layout(space: spaces.Space) -> tuple[tuple[int, ...], Any]:
    """(per-agent action shape, dtype) as actions travel between runner, agents and envs."""
    if isinstance(space, spaces.Discrete):
        return (), np.dtype(np.int64)
    if isinstance(space, spaces.MultiDiscrete):
        return (len(space.nvec),), np.dtype(np.int64)
    return tuple(space.shape), np.dtype(np.float32)


def is_channels_last(shape: tuple[int, ...]) -> bool:
    """Whether a 3-D image shape is ``[H, W, C]`` rather than ``[C, H, W]``: the channel axis is the
    short one (``(13, 13, 5)``, ``(120, 160, 3)`` -> True; ``(4, 84, 84)`` -> False)."""
    return len(shape) == 3 and shape[2] < shape[0] and shape[2] < shape[1]


@dataclass
class GroupSpec:
    name: str
    agents: list[str]
    observation_space: spaces.Space
    action_space: spaces.Space

    @property
    def n_agents(self) -> int:
        return len(self.agents)

    @property
    def obs_shape(self) -> tuple[int, ...]:
        return tuple(self.observation_space.shape)

    @property
    def n_actions(self) -> int:
        """Width of ``action_mask``: choices of a Discrete, sum of a MultiDiscrete's, 0 for Box."""
        space = self.action_space
        if isinstance(space, spaces.Discrete):
            return int(space.n)
        if isinstance(space, spaces.MultiDiscrete):
            return int(np.sum(space.nvec))
        return 0

    def signature(self) -> dict:
        """What a checkpoint must match to be loaded into this group."""
        return {"agents": list(self.agents), "observation_space": repr(self.observation_space),
                "action_space": repr(self.action_space)}


@dataclass
class EnvSpec:
    groups: dict[str, GroupSpec]
    state_shape: tuple[int, ...]
    render_fps: int = 10
    state_dtype: Any = np.float32   # uint8 for image states: stored and shipped as such, scaled by the model

    def signature(self) -> dict:
        return {g: spec.signature() for g, spec in self.groups.items()}

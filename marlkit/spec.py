"""What the runner, envs and agents agree on about an env's agent groups and spaces.

Kept apart from ``marlkit.envs`` and ``marlkit.agents`` so that neither has to import the other.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces


def hybrid_parts(space: spaces.Space) -> tuple[int, list[int]] | None:
    """``(continuous size, discrete branch sizes)`` of a hybrid action space ``Tuple((Box(n,),
    MultiDiscrete(nvec)))`` (continuous actions and discrete branches together, as Unity ML-Agents
    allows); None for any other space. A hybrid action travels as one float vector: the
    continuous values, then the branch choices."""
    if (isinstance(space, spaces.Tuple) and len(space.spaces) == 2 and isinstance(space.spaces[0], spaces.Box)
            and isinstance(space.spaces[1], spaces.MultiDiscrete)):
        return int(np.prod(space.spaces[0].shape)), [int(n) for n in np.asarray(space.spaces[1].nvec).reshape(-1)]
    return None


def action_layout(space: spaces.Space) -> tuple[tuple[int, ...], Any]:
    """(per-agent action shape, dtype) as actions travel between runner, agents and envs."""
    hybrid = hybrid_parts(space)
    if hybrid is not None:
        return (hybrid[0] + len(hybrid[1]),), np.dtype(np.float32)
    if isinstance(space, spaces.Discrete):
        return (), np.dtype(np.int64)
    if isinstance(space, spaces.MultiDiscrete):
        return (len(space.nvec),), np.dtype(np.int64)
    return tuple(space.shape), np.dtype(np.float32)


def is_channels_last(shape: tuple[int, ...]) -> bool:
    """Whether a 3-D image shape is ``[H, W, C]`` rather than ``[C, H, W]``: the channel axis is the
    short one (``(13, 13, 5)``, ``(120, 160, 3)`` -> True; ``(4, 84, 84)`` -> False). A guess, for
    images whose layout nobody declared (``GroupSpec.channels_last``, ``EnvSpec.state_channels_last``):
    a stack of many agents' views, ``(5 * 4, 13, 11)``, would be misread."""
    return len(shape) == 3 and shape[2] < shape[0] and shape[2] < shape[1]


@dataclass
class GroupSpec:
    name: str
    agents: list[str]
    observation_space: spaces.Space
    action_space: spaces.Space
    channels_last: bool | None = None   # layout of image observations; None: guessed from the shape
    # Several sensors in one flat observation: their shapes, in the order they are concatenated
    # (a Unity agent with a camera and vector sensors); None: the observation is one array.
    obs_parts: tuple[tuple[int, ...], ...] | None = None
    # Per agent slot, the sub-team whose agents its centralised critic reads together, for a group
    # that spans independent copies of one game (the fields of a Unity scene, told apart by
    # ML-Agents' group ids); 0: the agent's critic reads the whole group. None: no sub-teams.
    # The actor is shared across sub-teams as across the group.
    subteams: tuple[int, ...] | None = None

    @property
    def n_agents(self) -> int:
        return len(self.agents)

    @property
    def obs_shape(self) -> tuple[int, ...]:
        return tuple(self.observation_space.shape)

    @property
    def n_actions(self) -> int:
        """Width of ``action_mask``: choices of a Discrete, sum of a MultiDiscrete's (or of a hybrid
        space's branches), 0 for Box."""
        space = self.action_space
        hybrid = hybrid_parts(space)
        if hybrid is not None:
            return sum(hybrid[1])
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
    state_channels_last: bool | None = None   # layout of an image state; None: guessed from the shape
    # True when the state was built from the agents' observations (the env has no compact state()
    # of its own): a critic gains nothing from it that the observations do not hold, so MAPPO's
    # ``critic_input: auto`` reads the observations themselves (a pooled critic) instead
    state_from_obs: bool = False
    # the most steps an episode lasts, where the env knows it (its time limit), else None: a replay of
    # episodes sizes its slots with it
    episode_limit: int | None = None
    # team name -> its groups, in the env's group order: the groups that share a reward. Declared by
    # env types that know them (a Unity scene's team ids), else settled by the runner (env.teams,
    # or the random policy's rewards); None: not settled yet
    teams: dict[str, list[str]] | None = None

    def team_of(self, group: str) -> str:
        """The team ``group`` plays in (its own name where teams are not settled)."""
        return next((t for t, members in (self.teams or {}).items() if group in members), group)

    def state_in_obs_of(self, group: str) -> bool:
        """Whether ``group``'s own observations hold all that the state tells its team: the state
        was built from the observations, and no other group plays in its team (a critic that pools
        the group's observations would miss its teammates' otherwise)."""
        return self.state_from_obs and (self.teams or {}).get(self.team_of(group), [group]) == [group]

    def signature(self) -> dict:
        return {g: spec.signature() for g, spec in self.groups.items()}

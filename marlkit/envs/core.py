"""The multi-agent env contract seen by the runner.

Agents are split into groups; every agent of a group shares observation and action spaces and one
learning agent. Agent slots come from ``possible_agents`` and never change within a run, so every
array has a static shape. Per group ``g`` with ``A_g`` slots, a single env speaks in ``[A_g, ...]``
arrays and a vector of ``E`` envs in ``[E, A_g, ...]`` arrays:

======================  ==========================  =================================================
name                    shape (vector env)          meaning
======================  ==========================  =================================================
``obs[g]``              ``[E, A_g, *obs_shape]``    per-agent observation, zeros where absent
``state``               ``[E, *state_shape]``       global state (``env.state()`` or concatenated obs)
``agent_mask[g]``       ``[E, A_g]`` bool           agent present and acting this step
``action_mask[g]``      ``[E, A_g, n_actions]``     True = allowed (all True when the env gives none)
``reward[g]``           ``[E, A_g]`` float32        per agent
``terminated[g]``       ``[E, A_g]`` bool           agent's episode ended for good
``truncated[g]``        ``[E, A_g]`` bool           agent's episode was cut (time limit)
``episode_end``         ``[E]`` bool                the env finished an episode and was reset
======================  ==========================  =================================================
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from marlkit.spec import EnvSpec, GroupSpec, action_layout  # noqa: F401  (part of the contract)


class EnvAPIError(RuntimeError):
    """An env broke its own API; the message names the agent and the step."""


class EnvWorkerError(RuntimeError):
    """A vector-env worker died, hung or raised; the message names the env index."""


@dataclass
class Observation:
    """What the agents see; single env ``[A_g, ...]``, vector env ``[E, A_g, ...]``."""

    obs: dict[str, np.ndarray]
    state: np.ndarray
    agent_mask: dict[str, np.ndarray]
    action_mask: dict[str, np.ndarray]


@dataclass
class StepResult:
    """One vector step. ``final`` holds, where ``episode_end`` is True, the last observation of the
    finished episode (needed to bootstrap truncated episodes); ``next`` is already the first
    observation of the new episode there."""

    next: Observation
    reward: dict[str, np.ndarray]
    terminated: dict[str, np.ndarray]
    truncated: dict[str, np.ndarray]
    episode_end: np.ndarray
    final: Observation
    infos: list[dict[str, Any]] = field(default_factory=list)


class MultiAgentEnv:
    """One env instance in ``[A_g, ...]`` arrays. Adapters implement this; vector envs batch it."""

    spec: EnvSpec

    def reset(self, seed: int | None = None) -> Observation:
        raise NotImplementedError

    def step(self, actions: dict[str, np.ndarray]) -> tuple[Observation, dict, dict, dict, bool]:
        """``actions[g]`` is ``[A_g, *action_shape]``; returns (obs, reward, terminated, truncated,
        episode_over); slots of absent agents are ignored."""
        raise NotImplementedError

    def render(self) -> np.ndarray | None:
        return None

    def close(self) -> None:
        pass


def empty_observation(spec: EnvSpec, batch: tuple[int, ...] = ()) -> Observation:
    """Zero-filled arrays with the contract's dtypes; ``batch=(E,)`` for a vector env."""
    obs, agent_mask, action_mask = {}, {}, {}
    for g, gs in spec.groups.items():
        dtype = gs.observation_space.dtype if gs.observation_space.dtype is not None else np.float32
        obs[g] = np.zeros(batch + (gs.n_agents,) + gs.obs_shape, dtype=dtype)
        agent_mask[g] = np.zeros(batch + (gs.n_agents,), dtype=bool)
        action_mask[g] = np.ones(batch + (gs.n_agents, gs.n_actions), dtype=bool)
    return Observation(obs, np.zeros(batch + spec.state_shape, spec.state_dtype), agent_mask, action_mask)


def group_arrays(spec: EnvSpec, dtype, batch: tuple[int, ...] = ()) -> dict[str, np.ndarray]:
    return {g: np.zeros(batch + (gs.n_agents,), dtype=dtype) for g, gs in spec.groups.items()}

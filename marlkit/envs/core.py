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
``agent_end[g]``        ``[E, A_g]`` bool           the agent's own episode ended, its env goes on
======================  ==========================  =================================================

Per-agent episodes. In some envs an agent's episode ends while its env goes on, and the same agent
slot then plays a new episode (Unity scenes with several fields, respawning agents). Such an env
sets ``Observation.final`` in the observation ``step`` returns: for every agent that terminated or
was truncated this step, its last observation of the finished episode (other slots as in the
observation itself); the returned observation already shows the agent's new episode, or marks it
absent until it asks for its next decision. The vector env reports these agents in
``agent_end``, puts their final observation in ``StepResult.final`` (truncated agents bootstrap
from it), logs their returns as finished episodes, and the runner resets their recurrent state.
Envs whose agents do not come back (an agent that dies stays absent until the env resets) leave
``final`` as None. Rewards that reach an agent while it is absent (between two of its decisions)
belong to its last action; ``terminated``/``truncated`` may likewise arrive while it is absent.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from marlkit.errors import EnvAPIError, EnvWorkerError  # noqa: F401  (part of the contract)
from marlkit.spec import EnvSpec, GroupSpec, action_layout  # noqa: F401  (part of the contract)


@dataclass
class Observation:
    """What the agents see; single env ``[A_g, ...]``, vector env ``[E, A_g, ...]``."""

    obs: dict[str, np.ndarray]
    state: np.ndarray
    agent_mask: dict[str, np.ndarray]
    action_mask: dict[str, np.ndarray]
    # single env only: the last observation of agents whose own episode ended while the env goes
    # on (see "Per-agent episodes" above); None when no agent restarts
    final: "Observation | None" = None

    def rows(self, first: int, count: int) -> "Observation":
        """Envs ``first .. first + count - 1`` of a vector env's observation (views)."""
        part = slice(first, first + count)
        return Observation({g: o[part] for g, o in self.obs.items()}, self.state[part],
                           {g: m[part] for g, m in self.agent_mask.items()},
                           {g: m[part] for g, m in self.action_mask.items()})

    @staticmethod
    def join(parts: list["Observation"]) -> "Observation":
        """A vector env's observation from those of consecutive blocks of its envs, in env order."""
        groups = parts[0].obs
        return Observation({g: np.concatenate([p.obs[g] for p in parts]) for g in groups},
                           np.concatenate([p.state for p in parts]),
                           {g: np.concatenate([p.agent_mask[g] for p in parts]) for g in groups},
                           {g: np.concatenate([p.action_mask[g] for p in parts]) for g in groups})


@dataclass
class StepResult:
    """One vector step. ``final`` holds, where ``episode_end`` is True, the last observation of the
    finished episode (needed to bootstrap truncated episodes); ``next`` is already the first
    observation of the new episode there. Likewise for single agents where ``agent_end`` is True.
    When nothing ended, ``final`` is ``next`` itself (the same arrays): read both, write neither.
    ``lost`` ``[E]`` (None: none) marks envs whose step was lost with the worker that hosted them
    (a Ray node gone): their episode ends truncated at the observation the step was asked from, and
    nothing of the step is real, so the runner does not learn from it."""

    next: Observation
    reward: dict[str, np.ndarray]
    terminated: dict[str, np.ndarray]
    truncated: dict[str, np.ndarray]
    episode_end: np.ndarray
    final: Observation
    infos: list[dict[str, Any]] = field(default_factory=list)
    agent_end: dict[str, np.ndarray] = field(default_factory=dict)
    lost: np.ndarray | None = None


class MultiAgentEnv:
    """One env instance in ``[A_g, ...]`` arrays. Adapters implement this; vector envs batch it."""

    spec: EnvSpec
    # True when pickling the env object captures its whole state, so a resumed run continues the
    # very same episodes (see EnvConfig.exact_resume).
    exact_resume: bool = False
    # True for an env type whose envs come as one batch (VMAS: E copies in tensors, one step for all):
    # the vector layer asks its ``vector_env(cfg, num_envs, render, first_index)`` for the whole
    # vector env instead of building one env per slot
    batched: bool = False

    @classmethod
    def check_config(cls, cfg) -> None:
        """Settings of a run (``cfg``: the RunConfig, ``cfg.env`` this type's config) that this env
        type cannot run with, raised as ConfigError before any env starts."""

    @classmethod
    def probe_spec(cls, cfg) -> EnvSpec | None:
        """The spec of this type's envs (``cfg``: its env config) learnt without starting a vector
        env, where that saves launching processes only to be refused; None: the vector env tells."""
        return None

    def reset(self, seed: int | None = None) -> Observation:
        raise NotImplementedError

    def step(self, actions: dict[str, np.ndarray]) -> tuple[Observation, dict, dict, dict, bool]:
        """``actions[g]`` is ``[A_g, *action_shape]``; returns (obs, reward, terminated, truncated,
        episode_over); slots of absent agents are ignored."""
        raise NotImplementedError

    def render(self) -> np.ndarray | None:
        return None

    def episode_stats(self) -> dict[str, float]:
        """Numbers about the episode that has just ended (Doom: kills, deaths), asked for once when
        it ends, before the reset; logged beside the return as ``env/<name>`` and kept in each
        evaluation. None by default."""
        return {}

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


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

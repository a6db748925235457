"""What storage is laid out for, and what the collector writes into it: a step, and the observation
after a rollout's last step."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from marlkit.spec import EnvSpec, GroupSpec


@dataclass(frozen=True)
class StorageLayout:
    """One group's storage: its spaces, the env's state, ``num_envs`` envs and ``horizon`` steps per
    collect. ``double``: a rollout is collected while the one before is trained on
    (``runner.overlap``), so two exist at once."""

    group: GroupSpec
    env: EnvSpec
    num_envs: int
    horizon: int
    double: bool = False

    def for_envs(self, num_envs: int) -> "StorageLayout":
        return replace(self, num_envs=num_envs)


@dataclass
class Transition:
    """One vector step of one group, as the collector writes it into a rollout.

    Arrays are ``[E, A, ...]`` (``state`` and ``episode_end`` are per env). ``hidden`` is the hidden
    state that was fed to ``act``; ``final_obs``/``final_state`` are the last observation before an
    auto-reset (used to bootstrap truncated episodes); ``extras`` travel untouched from ``ActOut``;
    ``agent_end`` ``[E, A]`` marks agents whose own episode ended while their env goes on (None: none
    did), so that training resets their memory where acting did; ``final_action_mask`` is the action
    mask that goes with ``final_obs`` (None: every action allowed), for agents that pick an action
    there to value a truncated episode (COMA's Q of a joint action, a Q-learner's target).
    """

    obs: np.ndarray
    state: np.ndarray
    agent_mask: np.ndarray
    action_mask: np.ndarray
    actions: np.ndarray
    log_prob: np.ndarray
    value: np.ndarray | None
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    episode_end: np.ndarray
    final_obs: np.ndarray
    final_state: np.ndarray
    hidden: np.ndarray | None = None
    next_hidden: np.ndarray | None = None
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    agent_end: np.ndarray | None = None
    final_action_mask: np.ndarray | None = None


@dataclass
class Bootstrap:
    """The observation after the last stored step, to value the rollout's tail."""

    obs: np.ndarray           # [E, A, *obs_shape]
    state: np.ndarray         # [E, *state_shape]
    agent_mask: np.ndarray    # [E, A]
    action_mask: np.ndarray   # [E, A, n_actions]
    hidden: np.ndarray | None

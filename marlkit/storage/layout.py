"""The storage contract: what storage is laid out for, what the collector hands it step by step and
at the end of a collect, and what a storage gives the agent to learn from.

Every family's storage is filled the same way: the collector (in this process, or an env worker
for its block of envs) writes one :class:`Transition` per step into a :class:`~marlkit.storage.
rollout.Rollout` of ``[T, E, A, ...]`` arrays, and hands the finished rollout over as a
:class:`Collected` with the observation after its last step. ``Storage.finish`` turns it into the
batch the agent's ``update`` consumes: the rollout itself for on-policy agents, the episodes it
completed, added to a replay, for value decomposition.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from marlkit.spec import EnvSpec, GroupSpec

if TYPE_CHECKING:
    from marlkit.storage.rollout import Rollout


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


@dataclass
class Collected:
    """What one collect gave one group: the full rollout and the observation after it."""

    rollout: "Rollout"
    bootstrap: Bootstrap


class Storage:
    """A group's storage, made by its agent (``Agent.make_storage``) and held by the collector."""

    layout: StorageLayout

    def next_rollout(self) -> "Rollout":
        """An empty rollout for the next collect (with ``layout.double``, not the one handed over
        last, which may still be trained on)."""
        raise NotImplementedError

    def new_rollout(self, num_envs: int) -> "Rollout":
        """An empty rollout of this layout for ``num_envs`` envs: an env worker's block, filled there
        and joined into ``next_rollout()`` here."""
        raise NotImplementedError

    def finish(self, collected: Collected) -> Any:
        """The batch ``Agent.update`` learns from, made of a finished collect. Called at a rollout
        boundary, when no update runs."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """What the storage carries from one collect to the next, for a checkpoint."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """The inverse of ``state_dict``."""

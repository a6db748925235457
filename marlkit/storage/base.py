"""The storage contract: what the collector hands a storage at the end of a collect, and what a
storage gives the agent to learn from.

Every family's storage is filled the same way: the collector (in this process, or an env worker
for its block of envs) writes one :class:`~marlkit.storage.layout.Transition` per step into a
:class:`~marlkit.storage.rollout.Rollout` of ``[T, E, A, ...]`` arrays, and hands the finished
rollout over as a :class:`Collected` with the observation after its last step. ``Storage.finish``
turns it into the batch the agent's ``update`` consumes: the rollout itself for on-policy agents,
what it completed, added to a replay (of episodes or of transitions), for off-policy agents.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from marlkit.storage.layout import Bootstrap, StorageLayout
from marlkit.storage.rollout import Rollout


@dataclass
class Collected:
    """What one collect gave one group: the full rollout and the observation after it."""

    rollout: Rollout
    bootstrap: Bootstrap


@dataclass
class ReplayBatch:
    """What an off-policy update learns from: the replay, with what this rollout completed already
    in it, the episodes that ended in the rollout and its env steps (each env's step counts one)."""

    replay: Any
    new_episodes: int
    env_steps: int


class Storage:
    """A group's storage, made by its agent (``Agent.make_storage``) and held by the collector. It
    lends the collector rollouts of ``layout`` (``stores_state``: with the global state;
    ``hidden_shape``: with each agent's hidden state per step), two in turn with ``layout.double``."""

    def __init__(self, layout: StorageLayout, stores_state: bool, hidden_shape: tuple | None = None):
        self.layout = layout
        first = Rollout.of(layout, stores_state, hidden_shape)
        self._rollouts = [first, first.for_envs(layout.num_envs)] if layout.double else [first]
        self._turn = 0

    def next_rollout(self) -> Rollout:
        """An empty rollout for the next collect (with ``layout.double``, not the one handed over
        last, which may still be trained on)."""
        rollout = self._rollouts[self._turn]
        self._turn = (self._turn + 1) % len(self._rollouts)
        rollout.reset()
        return rollout

    def new_rollout(self, num_envs: int) -> Rollout:
        """An empty rollout of this layout for ``num_envs`` envs: an env worker's block, filled there
        and joined into ``next_rollout()`` here."""
        return self._rollouts[0].for_envs(num_envs)

    def finish(self, collected: Collected) -> Any:
        """The batch ``Agent.update`` learns from, made of a finished collect. Called at a rollout
        boundary, when no update runs."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """What the storage carries from one collect to the next, for a checkpoint."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """The inverse of ``state_dict``."""

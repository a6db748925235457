"""Off-policy storage: a replay of transitions, for the actor-critics of continuous actions (MADDPG,
MATD3, MASAC, IDDPG, ISAC).

Collection fills the same rollouts ``[T, E, A, ...]`` as for every agent; at each rollout boundary
``finish`` cuts them into transitions, one per env step in which some agent of the group was
present: every agent's observation, agent mask, action and reward, the global state where it is
kept, what came after (the next observation and state) and ``bootstrap`` ``[A]``: whether the
agent's value after the step counts in its target. It does where the agent goes on (present at the
next step) or where a time limit cut its episode (then from the observation the episode ended at);
never after a termination, nor for an agent absent at the step.

The replay is a ring of ``capacity`` transitions; the oldest give way when it is full. Observations
keep their dtype (uint8 images stay uint8).
"""
from __future__ import annotations

import numpy as np

from marlkit.storage.base import Collected, ReplayBatch, Storage
from marlkit.storage.layout import StorageLayout

_FIELDS = ("obs", "agent_mask", "actions", "reward", "next_obs", "bootstrap")
_STATE_FIELDS = ("state", "next_state")


class TransitionReplay(Storage):
    """Transitions of one group in a ring of ``capacity``; ``stores_state``: keep the global state and
    the next one (a centralised critic reads them)."""

    def __init__(self, layout: StorageLayout, capacity: int, stores_state: bool):
        super().__init__(layout, stores_state)
        self.capacity, self.stores_state = capacity, stores_state
        self.ring: dict[str, np.ndarray] | None = None   # allocated with the first transitions
        self.size = 0            # transitions held
        self.next_slot = 0
        self.transitions = 0     # transitions ever added

    # ------------------------------------------------------------------ collection

    def finish(self, collected: Collected) -> ReplayBatch:
        """The rollout's transitions into the ring: ``[T, E, A, ...]`` arrays and the bootstrap
        observation become rows ``[A, ...]``, in time order."""
        rollout, after = collected.rollout, collected.bootstrap
        present = rollout.agent_mask
        next_obs = np.concatenate([rollout.obs[1:], after.obs[None]])                    # [T, E, A, ...]
        next_present = np.concatenate([present[1:], after.agent_mask[None]])
        ended = rollout.agent_end | rollout.episode_end[..., None]                        # [T, E, A]
        cut = rollout.truncated & ~rollout.terminated
        bootstrap = np.where(ended, cut, next_present) & ~rollout.terminated & present
        rows = {"obs": rollout.obs, "agent_mask": present, "actions": rollout.actions, "reward": rollout.reward,
                "next_obs": next_obs, "bootstrap": bootstrap}
        if self.stores_state:
            rows["state"] = rollout.state
            rows["next_state"] = np.concatenate([rollout.state[1:], after.state[None]])
        for t, e, obs, state, *_ in rollout.finals:   # a time limit's cut: what the episode ended at
            next_obs[t, e, cut[t, e]] = obs[cut[t, e]]
            if self.stores_state and rollout.episode_end[t, e]:
                rows["next_state"][t, e] = state
        kept = present.any(-1).reshape(-1)                                                # [T * E]
        self._add({name: value.reshape(-1, *value.shape[2:])[kept] for name, value in rows.items()})
        episodes = int(rollout.episode_end.sum())
        return ReplayBatch(self, episodes, rollout.horizon * rollout.num_envs)

    def _add(self, rows: dict[str, np.ndarray]) -> None:
        count = len(rows["obs"])
        self.transitions += count
        if self.ring is None:
            self.ring = {name: np.zeros((self.capacity, *v.shape[1:]), v.dtype) for name, v in rows.items()}
        if count > self.capacity:
            rows, count = {name: v[-self.capacity:] for name, v in rows.items()}, self.capacity
        slots = (self.next_slot + np.arange(count)) % self.capacity
        for name, value in rows.items():
            self.ring[name][slots] = value
        self.next_slot = int((self.next_slot + count) % self.capacity)
        self.size = min(self.size + count, self.capacity)

    # ------------------------------------------------------------------ learning

    def __len__(self) -> int:
        return self.size

    def sample_index(self, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        """The slots of ``batch_size`` transitions drawn uniformly, with replacement."""
        return rng.integers(0, self.size, batch_size)

    def take(self, index: np.ndarray) -> dict[str, np.ndarray]:
        """The transitions in slots ``index``: ``[B, A, ...]`` per agent, ``[B, ...]`` for states."""
        return {name: ring[index] for name, ring in self.ring.items()}

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict:
        """The slots filled so far alone (a ring of a million transitions is a gigabyte; early in a
        run a checkpoint holds what was collected, not the ring's size): views, pickled with the
        checkpoint at the rollout boundary, where nothing writes to the ring."""
        held = None if self.ring is None else {name: ring[:self.size] for name, ring in self.ring.items()}
        return {"held": held, "size": self.size, "next_slot": self.next_slot, "transitions": self.transitions}

    def load_state_dict(self, state: dict) -> None:
        held, self.size = state["held"], state["size"]
        self.next_slot, self.transitions = state["next_slot"], state["transitions"]
        self.ring = None
        if held is not None:
            self.ring = {name: np.zeros((self.capacity, *v.shape[1:]), v.dtype) for name, v in held.items()}
            for name, value in held.items():
                self.ring[name][:self.size] = value

    @staticmethod
    def bytes_per_transition(layout: StorageLayout, stores_state: bool) -> int:
        """Ring bytes of one transition."""
        group = layout.group
        obs = int(np.prod(group.obs_shape, dtype=np.int64)) * np.dtype(group.observation_space.dtype or
                                                                       np.float32).itemsize
        state = int(np.prod(layout.env.state_shape, dtype=np.int64)) * np.dtype(layout.env.state_dtype).itemsize \
            if stores_state else 0
        action = int(np.prod(group.action_space.shape or (1,), dtype=np.int64)) * 4
        return group.n_agents * (2 * obs + action + 4 + 2) + 2 * state

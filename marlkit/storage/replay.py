"""Off-policy storage: a replay of whole episodes, for value decomposition (IQL, VDN, QMIX).

Collection fills the same rollouts ``[T, E, A, ...]`` as for on-policy agents; at each rollout
boundary ``finish`` cuts them into episodes (an env's steps from its reset to its episode's end,
which may span several rollouts) and the ones that ended enter the replay. An episode keeps every
step's observation, state, agent mask, action mask, joint action, rewards and per-agent ends, and
one step more: the observation after its last step, which a time limit's truncation bootstraps
from (a terminated episode's is never read). Recurrent agents train on whole episodes from a zero
memory, as they acted.

The replay is a ring of ``capacity`` episode slots of ``[L + 1, ...]`` arrays; ``L`` is the
env's episode limit where its spec knows it, else it grows to the longest episode seen.
Observations keep their dtype (uint8 images stay uint8).
"""
from __future__ import annotations

import numpy as np

from marlkit.storage.base import Collected, ReplayBatch, Storage
from marlkit.storage.layout import StorageLayout
from marlkit.storage.rollout import Rollout

# the rollout's fields an episode keeps: per step and the step after the last ([L + 1]), and per step
_STEP_FIELDS = ("obs", "state", "agent_mask", "action_mask")
_ACTION_FIELDS = ("actions", "reward", "terminated", "truncated", "agent_end")


class EpisodeReplay(Storage):
    """Whole episodes of one group in a ring of ``capacity`` slots. ``stores_state``: keep the
    global state (a mixer conditioned on it reads it)."""

    def __init__(self, layout: StorageLayout, capacity: int, stores_state: bool):
        super().__init__(layout, stores_state)
        self.capacity, self.stores_state = capacity, stores_state
        self.limit = layout.env.episode_limit or layout.horizon
        self.ring: dict[str, np.ndarray] | None = None     # allocated with the first episode
        self.lengths = np.zeros(capacity, np.int64)
        self.size = 0          # episodes held
        self.next_slot = 0
        self.episodes = 0      # episodes ever added
        self.partial: list[dict[str, list]] = [self._empty_partial() for _ in range(layout.num_envs)]

    # ------------------------------------------------------------------ collection

    @staticmethod
    def _empty_partial() -> dict[str, list]:
        return {name: [] for name in (*_STEP_FIELDS, *_ACTION_FIELDS)}

    def finish(self, collected: Collected) -> ReplayBatch:
        """Append the rollout to each env's episode in progress; episodes that ended enter the ring
        (the oldest give way when it is full)."""
        rollout = collected.rollout
        finals = {(t, e): (obs, state, mask) for t, e, obs, state, _, mask in rollout.finals}
        ended = []
        for e in range(rollout.num_envs):
            start = 0
            for end in (*np.flatnonzero(rollout.episode_end[:, e]), None):
                stop = rollout.horizon if end is None else end + 1
                if stop > start:   # copies: the rollout's arrays are written again by the next collect
                    for name in (*_STEP_FIELDS, *_ACTION_FIELDS):
                        self.partial[e][name].append(getattr(rollout, name)[start:stop, e].copy())
                if end is not None:
                    ended.append((end, e, self.partial[e], finals.get((end, e))))
                    self.partial[e] = self._empty_partial()
                start = stop
        for _, _, part, final in sorted(ended, key=lambda x: x[:2]):   # in the order they ended
            self._add({name: np.concatenate(chunks) for name, chunks in part.items()}, final, rollout)
        return ReplayBatch(self, len(ended), rollout.horizon * rollout.num_envs)

    def _add(self, episode: dict[str, np.ndarray], final, rollout: Rollout) -> None:
        """One finished episode into the ring; ``final`` is (obs, state, action mask) after its last
        step where a time limit cut it (else the last step's own arrays stand in: never read)."""
        length = len(episode["actions"])
        if self.ring is None or length > self.ring["actions"].shape[1]:
            self._grow(max(length, self.limit), rollout)
        slot, ring = self.next_slot, self.ring
        for name in _ACTION_FIELDS:
            ring[name][slot, :length] = episode[name]
            ring[name][slot, length:] = 0
        after = dict(zip(("obs", "state", "action_mask"), final)) if final is not None else {}
        for name in _STEP_FIELDS:
            ring[name][slot, :length] = episode[name]
            ring[name][slot, length] = after.get(name, episode[name][-1])
            ring[name][slot, length + 1:] = 0
        self.lengths[slot] = length
        self.next_slot = (slot + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)
        self.episodes += 1

    def _grow(self, steps: int, rollout: Rollout) -> None:
        """Ring arrays for episodes of up to ``steps`` steps, the ones held kept."""
        shapes = {name: getattr(rollout, name).shape[2:] for name in (*_STEP_FIELDS, *_ACTION_FIELDS)}
        dtypes = {name: getattr(rollout, name).dtype for name in shapes}
        ring = {name: np.zeros((self.capacity, steps + (name in _STEP_FIELDS)) + shapes[name], dtypes[name])
                for name in shapes}
        if self.ring is not None:
            for name, old in self.ring.items():
                ring[name][:, :old.shape[1]] = old
        self.ring = ring

    # ------------------------------------------------------------------ learning

    def __len__(self) -> int:
        return self.size

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """``batch_size`` episodes drawn uniformly (``sample_index``), as ``take`` gives them."""
        return self.take(self.sample_index(batch_size, rng))

    def sample_index(self, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        """The slots of ``batch_size`` episodes drawn uniformly (with replacement only if fewer are
        held). The replays of a team's groups fill alike, so a slot holds the same episode in each."""
        return rng.choice(self.size, batch_size, replace=self.size < batch_size)

    def take(self, index: np.ndarray) -> dict[str, np.ndarray]:
        """The episodes in slots ``index``, cut to the longest of them: ``[B, L + 1, ...]`` for
        observations, states and masks, ``[B, L, ...]`` for actions, rewards and ends, ``filled``
        ``[B, L]`` (the step exists) and ``length``."""
        length = int(self.lengths[index].max())
        out = {name: self.ring[name][index, :length + (name in _STEP_FIELDS)] for name in self.ring}
        out["filled"] = np.arange(length)[None] < self.lengths[index][:, None]
        out["length"] = self.lengths[index]
        return out

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict:
        return {"ring": self.ring, "lengths": self.lengths, "size": self.size, "next_slot": self.next_slot,
                "episodes": self.episodes, "partial": self.partial}

    def load_state_dict(self, state: dict) -> None:
        self.ring, self.lengths, self.size = state["ring"], state["lengths"], state["size"]
        self.next_slot, self.episodes, self.partial = state["next_slot"], state["episodes"], state["partial"]

    @staticmethod
    def bytes_per_episode(layout: StorageLayout, stores_state: bool) -> int:
        """Ring bytes of one episode slot of ``env.episode_limit`` steps (``runner.horizon`` where
        the env does not tell its limit)."""
        group = layout.group
        steps = layout.env.episode_limit or layout.horizon
        obs = int(np.prod(group.obs_shape, dtype=np.int64)) * np.dtype(group.observation_space.dtype or
                                                                       np.float32).itemsize
        state = int(np.prod(layout.env.state_shape, dtype=np.int64)) * np.dtype(layout.env.state_dtype).itemsize \
            if stores_state else 0
        per_step = group.n_agents * (obs + group.n_actions + 8 + 4 + 3 + 1) + state
        return (steps + 1) * per_step

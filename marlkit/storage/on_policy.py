"""On-policy storage: a rollout ``[T, E, A, ...]`` learned from once, and its minibatches."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from marlkit.storage.base import Collected, Storage
from marlkit.storage.layout import Bootstrap, StorageLayout
from marlkit.storage.rollout import Rollout


@dataclass
class RolloutBatch:
    """What an on-policy update learns from: the rollout, the observation after it, and
    ``episode_start`` ``[T, E, A]``: step t opens the agent's episode (its env was reset, or its own
    episode ended, after step t-1), where acting reset its memory."""

    rollout: Rollout
    bootstrap: Bootstrap
    episode_start: np.ndarray

    @property
    def num_steps(self) -> int:
        """Env steps the rollout holds (``T * E``)."""
        return self.rollout.horizon * self.rollout.num_envs


class RolloutStorage(Storage):
    """A rollout per collect, learned from once: two alternate with ``layout.double`` (one is
    collected while the other is trained on). It carries the episode starts from one rollout to the
    next (``RolloutBatch.episode_start`` at t=0)."""

    def __init__(self, layout: StorageLayout, stores_state: bool, hidden_shape: tuple | None = None):
        super().__init__(layout, stores_state, hidden_shape)
        self._episode_start = np.ones((layout.num_envs, layout.group.n_agents), bool)

    def finish(self, collected: Collected) -> RolloutBatch:
        rollout = collected.rollout
        episode_start = rollout.episode_start(self._episode_start)
        self._episode_start = rollout.ends()[-1]
        return RolloutBatch(rollout, collected.bootstrap, episode_start)

    def state_dict(self) -> dict:
        return {"episode_start": self._episode_start.copy()}

    def load_state_dict(self, state: dict) -> None:
        self._episode_start = state["episode_start"].copy()


def minibatches(data: dict[str, np.ndarray], num_minibatches: int, chunk_length: int,
                rng: np.random.Generator, rows: bool = False) -> Iterator[dict[str, torch.Tensor]]:
    """Shuffle ``[T, E, ...]`` arrays into minibatches of sequences ``[L, B, ...]``.

    Feed-forward agents use ``chunk_length=1`` (every (t, e) is a sample, L=1); recurrent agents
    train on chunks of L consecutive steps of one env, starting from the stored hidden state.
    The agent dimension is kept, so a sample holds all agents of one env step together. Each
    minibatch is gathered straight from the ``[T, E, ...]`` arrays: nothing but the minibatch
    itself is copied, and every sample appears in exactly one minibatch per call. A single
    minibatch of single steps is the rollout as it is, unshuffled and uncopied. With ``rows``,
    each minibatch also says where its samples lie: ``rows`` ``[L, B]``, the index ``t * E + e``.
    """
    first = next(iter(data.values()))
    T, E = first.shape[:2]
    L = chunk_length
    if T % L:
        raise ValueError(f"rollout length {T} is not a multiple of the chunk length {L}")
    # [T * E, ...] views: one index_select of whole rows gathers a minibatch faster than indexing
    # time and env as two dimensions, with the same result
    arrays = {k: torch.from_numpy(v).reshape(T * E, *v.shape[2:]) for k, v in data.items()}
    n = (T // L) * E
    if num_minibatches == 1 and L == 1:
        # one minibatch of every step: its order changes nothing but the float summation order,
        # so it is the rollout itself, [1, T * E, ...] views, with no shuffle and no copy
        located = {"rows": torch.arange(T * E).unsqueeze(0)} if rows else {}
        yield {k: v.unsqueeze(0) for k, v in arrays.items()} | located
        return
    order = rng.permutation(n)
    steps = np.arange(L)[:, None]
    for idx in np.array_split(order, min(num_minibatches, n)):
        # sample i is the chunk starting at t = (i // E) * L of env i % E: rows t * E + e
        flat = torch.from_numpy(((idx // E) * L + steps) * E + idx % E)   # [L, B]
        located = {"rows": flat} if rows else {}
        yield {k: v.index_select(0, flat.reshape(-1)).reshape(*flat.shape, *v.shape[1:])
               for k, v in arrays.items()} | located


def gather(array: np.ndarray, rows: torch.Tensor) -> torch.Tensor:
    """The samples of a ``[T, E, ...]`` array at ``rows`` ``[L, B]`` (indices ``t * E + e``, as
    ``minibatches`` gives them) -> ``[L, B, ...]``."""
    flat = torch.from_numpy(array).reshape(array.shape[0] * array.shape[1], *array.shape[2:])
    return flat.index_select(0, rows.reshape(-1)).reshape(*rows.shape, *array.shape[2:])

"""A scripted connect four player, an opponent to evaluate against: it wins if it can, blocks if it
must, and otherwise plays a random allowed column."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from marlkit.agents.base import ActOut, Agent
from marlkit.registry import register_agent

ROWS, COLUMNS = 6, 7
DIRECTIONS = ((0, 1), (1, 0), (1, 1), (1, -1))


@dataclass
class ConnectFourRulesConfig:
    pass


def _lands(board: np.ndarray, column: int) -> int | None:
    """The row a piece dropped into ``column`` lands on (row 0 is the top), None when it is full."""
    empty = np.flatnonzero(board[:, column] == 0)
    return int(empty[-1]) if len(empty) else None


def _connects(pieces: np.ndarray, row: int, column: int) -> bool:
    """Whether a piece at (row, column) makes four in a line with ``pieces`` ``[6, 7]``."""
    for dr, dc in DIRECTIONS:
        count = 1
        for sign in (1, -1):
            r, c = row + sign * dr, column + sign * dc
            while 0 <= r < ROWS and 0 <= c < COLUMNS and pieces[r, c]:
                count += 1
                r, c = r + sign * dr, c + sign * dc
        if count >= 4:
            return True
    return False


def choose(mine: np.ndarray, theirs: np.ndarray, allowed: np.ndarray, scores: np.ndarray) -> int:
    """The column to play: one that wins, else one that stops the other player's win, else the
    allowed column with the highest of ``scores`` (uniform draws: a random allowed column)."""
    board = mine + theirs
    for pieces in (mine, theirs):
        for column in np.flatnonzero(allowed):
            row = _lands(board, column)
            if row is not None and _connects(pieces, row, column):
                return int(column)
    return int(np.where(allowed, scores, -1.0).argmax())


@register_agent("connect_four_rules")
class ConnectFourRules(Agent):
    """Scripted connect four: win if you can, block if you must, otherwise a random allowed column
    (PettingZoo's connect_four_v3 observation: ``[6, 7, 2]``, the mover's pieces then the other's)."""

    config_cls = ConnectFourRulesConfig
    learns = False

    def act(self, obs, state, agent_mask, action_mask, hidden, explore: bool = True, progress=None) -> ActOut:
        E, A = agent_mask.shape
        # drawn for every env and agent whatever is chosen, so an env's stream moves alike each step
        scores = self.streams.uniform(action_mask.shape)
        actions = np.zeros((E, A), np.int64)
        for e in range(E):
            for a in range(A):
                if agent_mask[e, a]:
                    actions[e, a] = choose(obs[e, a, ..., 0], obs[e, a, ..., 1], action_mask[e, a].astype(bool),
                                           scores[e, a])
        return ActOut(actions, np.zeros((E, A), np.float32))

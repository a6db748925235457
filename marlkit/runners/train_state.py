"""Where a training run stands, as one typed object that saves and restores itself.

Everything here changes only at rollout boundaries (the observation and hidden state move with
every collect), so a checkpoint written at a boundary holds a state that agrees with the agents'
weights and optimisers and with the envs.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, fields
from typing import Any

from marlkit.envs.core import Observation
from marlkit.storage import Collected


def _recent() -> deque:
    return deque(maxlen=100)


@dataclass
class TrainState:
    """``steps``: env steps learned from (every env's, at the last rollout boundary); ``updates``:
    updates done; ``obs`` / ``hidden``: where collection goes on from (per group ``[E, A, ...]``);
    ``pending``: per learning group, the rollout collected beside the last update
    (``runner.overlap``), to be learned from next; ``policy_streams``: where each group's acting
    streams stand; ``storage``: what each learning group's storage carries from one rollout to the
    next (episode starts, a replay); ``recent`` / ``recent_stats``: the last 100 finished episodes'
    returns and statistics; ``episodes``: episodes finished; ``best``, ``evaluations``,
    ``baseline``: the evaluation rows (benchmark mode); ``next_*``: the steps of the next
    evaluation, checkpoint and log line; ``wall_time_s``: wall seconds of training before this
    process, for a resumed run's report."""

    obs: Observation
    hidden: dict[str, Any]
    steps: int = 0
    updates: int = 0
    episodes: int = 0
    pending: dict[str, Collected] | None = None
    policy_streams: dict[str, dict] = field(default_factory=dict)
    storage: dict[str, dict] = field(default_factory=dict)
    recent: deque = field(default_factory=_recent)
    recent_stats: deque = field(default_factory=_recent)
    best: dict | None = None
    evaluations: list[dict] = field(default_factory=list)
    baseline: dict | None = None
    next_eval: int = 0
    next_save: int = 0
    next_log: int = 0
    wall_time_s: float = 0.0
    self_play: dict | None = None   # the league's state (runners/self_play.py), in a self-play run

    def __post_init__(self):
        self.finished: list[dict] = []   # the episodes finished since the last ``take_finished``

    def count_episodes(self, episodes) -> None:
        """Finished episodes' returns and statistics into the recent ones and the count."""
        for episode in episodes:
            self.finished.append(episode)
            self.recent.append(episode["return"])
            self.episodes += 1
            if "stats" in episode:
                self.recent_stats.append(episode["stats"])

    def take_finished(self) -> list[dict]:
        """The episodes finished since the last call (each its ``return``, ``length`` and ``stats``)."""
        taken, self.finished = self.finished, []
        return taken

    def state_dict(self, resumable: bool = True) -> dict:
        """Every field as plain data; with ``resumable=False`` (best.pt, never resumed from) without
        the rollout in flight and the storages' contents."""
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        state["recent"], state["recent_stats"] = list(self.recent), list(self.recent_stats)
        if not resumable:
            state["pending"], state["storage"] = None, {}
        return state

    @classmethod
    def from_state_dict(cls, state: dict) -> "TrainState":
        out = cls(**{**state, "recent": _recent(), "recent_stats": _recent()})
        out.recent.extend(state["recent"])
        out.recent_stats.extend(state["recent_stats"])
        return out

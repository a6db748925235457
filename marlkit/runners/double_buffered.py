"""Double-buffered collection (``runner.double_buffer``): acting off the envs' critical path.

Collection steps the envs, then acts on what they show, then steps them again: while the policies
act, the env workers wait, and while the envs step, the policies do. Here the envs are split in
two parts of whole env workers, which take turns: while one part steps, the policies act on the
other's observation. This is sample-factory's double-buffered sampling; it pays where acting
takes a good share of an env step's time and has a processor of its own (a GPU, or cores the envs
leave idle): on 2 CPU cores, where acting and doom_coop's engines share them, it measured no gain
(docs/benchmarks.md).

Each part is acted on alone, in its own batch, with its envs' random streams (``acting_on``), so
a run collects exactly what acting on blocks of a part's size collects without double buffering
(``runner.act_batch`` set to it): the same actions, rollouts and episodes, bit for bit.
"""
from __future__ import annotations

import os
from contextlib import ExitStack
from dataclasses import dataclass, field

import numpy as np

from marlkit.agents.base import Agent, Progress
from marlkit.envs.core import Observation
from marlkit.errors import ConfigError
from marlkit.runners.collector import Collector, act, bootstrap_of, record_step
from marlkit.storage import Collected, Rollout


@dataclass
class _Part:
    """One part of the envs during a collect: where it stands, what it stores, what it acted."""

    first: int
    count: int
    obs: Observation
    hidden: dict
    rollouts: dict[str, Rollout]
    outs: dict = field(default_factory=dict)
    finished: list = field(default_factory=list)

    @property
    def envs(self) -> tuple[int, int]:
        return self.first, self.count


class DoubleBufferedCollector(Collector):
    """A collector whose envs step in two parts (``venv.splits(2)``: whole env workers), one
    stepping while the policies act on the other."""

    def __init__(self, venv, agents: dict[str, Agent], learning_groups: list[str], horizon: int, overlap: bool,
                 act_batch: int | None = None):
        super().__init__(venv, agents, learning_groups, horizon, overlap, act_batch)
        if not venv.in_workers:
            raise ConfigError("runner.double_buffer: true needs env worker processes (runner.vectorize: subprocess)")
        try:
            self.splits = venv.splits(2)
        except ValueError as exc:   # one worker: runner.workers null on a 1-CPU machine
            raise ConfigError(f"runner.double_buffer: true: {exc} ({os.cpu_count()} CPUs); set runner.workers: 2 "
                              "or more, or runner.double_buffer: false") from None

    def _act(self, part: _Part, progress: Progress | None) -> None:
        """Act on ``part``'s observation and start stepping its envs with the actions."""
        with ExitStack() as acting:
            for policy in self.policies.values():
                acting.enter_context(policy.acting_on(part.first, part.count))
            part.outs = act(self.policies, part.obs, part.hidden, True, self.act_batch, progress)
        self.venv.step_async({g: out.actions for g, out in part.outs.items()}, part.envs)

    def collect(self, state, progress: Progress | None = None) -> dict[str, Collected]:
        rollouts = {g: self.storages[g].next_rollout() for g in self.learning_groups}
        parts = []
        for first, count in self.splits:
            hidden = {g: h[first:first + count] if h is not None else None for g, h in state.hidden.items()}
            parts.append(_Part(first, count, state.obs.rows(first, count), hidden,
                               {g: rollout.columns(first, count) for g, rollout in rollouts.items()}))
        for part in parts:
            self._act(part, progress)
        for t in range(self.horizon):
            for part in parts:
                res = self.venv.step_wait(part.envs)
                part.obs, part.hidden = record_step(part.rollouts, part.obs, part.hidden, part.outs, res, t,
                                                    part.finished)
                if t + 1 < self.horizon:
                    self._act(part, progress)
        for g, rollout in rollouts.items():
            rollout.adopt_columns([part.rollouts[g] for part in parts])
        state.obs = Observation.join([part.obs for part in parts])
        state.hidden = {g: None if h is None else np.concatenate([part.hidden[g] for part in parts])
                        for g, h in state.hidden.items()}
        # counted in the order (step, env) they would have ended in with the envs stepped as one
        finished = sorted(((t, part.first + e, episode) for part in parts for t, e, episode in part.finished),
                          key=lambda ended: ended[:2])
        state.count_episodes(episode for _, _, episode in finished)
        return {g: Collected(rollouts[g], bootstrap_of(state.obs, state.hidden, g)) for g in self.learning_groups}

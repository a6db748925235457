"""The update of the learning agents on their batches, in this thread or beside collection.

With ``background`` the update runs in a thread of its own while the collector fills the next
rollout in the main thread. Both spend most of their time in torch kernels, numpy and waits on env
worker processes, which release the interpreter lock, so the two use both cores. The main thread
keeps the signal handlers: a stop request reaches the update through ``Progress.stop_requested``.

The update runs on ``threads`` torch threads (``runner.update_threads``), acting on the runner's
(``runner.torch_threads``): OpenMP's thread count belongs to the thread that sets it, so the
update's thread sets its own; torch also keeps the last count set for threads that start later,
so the update gives the acting count back when done, stopped or failed. The count is fixed for
the whole update, never sized by what runs beside it: torch's kernels round sums otherwise on
another number of threads (a narrow head's weight gradient already does), and a count that
followed timing would make a run trained twice differ.
"""
from __future__ import annotations

import os
import threading
import time

import torch

from marlkit.agents.base import Agent, Progress


class Learner:
    def __init__(self, agents: dict[str, Agent], learning_groups: list[str], background: bool, threads: int | None = None):
        self.agents, self.learning_groups, self.background = agents, learning_groups, background
        # torch.get_num_threads also settles this thread's count, before an update's thread stores another
        self._acting_threads = torch.get_num_threads()
        self.threads = threads or self._acting_threads
        self._thread: threading.Thread | None = None
        self._result: dict | None = None
        self._error: BaseException | None = None
        self.wait_s = 0.0   # how long the last finish() waited for the update
        self.waited_s = 0.0   # and all of them

    def start(self, batches: dict, progress: Progress) -> None:
        """Begin updating every learning group on its batch (``Collector.finish``); a group whose
        schedule starts learning later (``Schedule.learning_starts`` env steps) is left out until then."""
        self._result, self._error = None, None
        if not self.background:
            self._update(batches, progress)
            return
        self._thread = threading.Thread(target=self._update, args=(batches, progress), name="marlkit-learner",
                                        daemon=True)
        self._thread.start()

    def _update(self, batches: dict, progress: Progress) -> None:
        # only on a change: setting the count also empties oneDNN's cache of convolution kernels
        own = self.threads != self._acting_threads
        try:
            if own:
                torch.set_num_threads(self.threads)
            metrics = {}
            for g in self.learning_groups:
                agent = self.agents[g]
                if progress.steps < agent.schedule.learning_starts:
                    continue
                update = agent.update(batches[g], progress)
                metrics.update({f"{g}/{k}": v for k, v in update.items()})
            self._result = metrics
        except BaseException as exc:   # re-raised in the main thread by finish()
            self._error = exc
        finally:
            if own:
                torch.set_num_threads(self._acting_threads)

    def bound_hint(self, waited_s: float, wall_s: float, updates: int) -> str | None:
        """A line for the user where the update beside collection bounds the run: collection waited
        ``waited_s`` of ``wall_s`` for the last ``updates`` updates, on one thread, with cores to
        spare after each rollout. None otherwise, and over fewer than 10 updates (start-up)."""
        if not self.background or self.threads != self._acting_threads or (os.cpu_count() or 1) < 2:
            return None
        if updates < 10 or waited_s < 0.5 * wall_s:
            return None
        return (f"marlkit: the update bounds this run (collection waited for it {waited_s / wall_s:.0%} of the "
                f"last {updates} updates); --config update_bound (each update on 2 threads after its rollout) "
                "may run it faster (docs/benchmarks.md)")

    def finish_quietly(self) -> bool:
        """Wait for the update while another error unwinds; -> whether it finished without one of
        its own (which gives way to the other)."""
        try:
            self.finish()
            return True
        except BaseException:
            return False

    def finish(self) -> dict[str, float]:
        """Wait for the update; -> its metrics, or the error it raised."""
        if self._thread is not None:
            start = time.perf_counter()
            self._thread.join()
            self._thread = None   # only once joined: a join cut short by a signal leaves the update known
            self.wait_s = time.perf_counter() - start
            self.waited_s += self.wait_s
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return self._result or {}

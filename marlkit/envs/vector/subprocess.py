"""Envs in worker processes: arrays through shared memory, or jobs run on the workers' own envs.

Workers are not daemonic, because game envs (ViZDoom, Unity) start processes of their own, so they
are stopped explicitly: on ``close()``, on an error, at interpreter exit, and by themselves when the
parent disappears (their command pipe reaches EOF). A worker that dies or stops answering becomes an
:class:`EnvWorkerError` naming the env it was busy with, within ``timeout`` seconds
(``start_timeout`` while the envs are built).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import select
import signal
import sys
import threading
import time
import traceback
from multiprocessing import resource_tracker, shared_memory

import numpy as np

from marlkit.envs.core import EnvWorkerError, Observation, StepResult
from marlkit.envs.main_guard import check_main_guarded
from marlkit.envs.vector.arrays import StepArrays, action_shapes
from marlkit.envs.vector.base import OPEN_VECTOR_ENVS, WorkerVectorEnv, env_seeds
from marlkit.envs.vector.state import dumps_state, loads_states
from marlkit.envs.vector.sync import EnvFactory, SyncVectorEnv
from marlkit.errors import ConfigError


def _attach(name: str) -> shared_memory.SharedMemory:
    # Python < 3.13 registers attached blocks with the resource tracker too, which then warns about
    # (or unlinks) blocks the parent still owns; only the creating parent should track them.
    register = resource_tracker.register
    resource_tracker.register = lambda *args, **kwargs: None
    try:
        return shared_memory.SharedMemory(name=name)
    finally:
        resource_tracker.register = register


class _Current:
    """The env index a worker is busy with, shared with the parent so that even a hard crash
    (a game segfaulting, os._exit) can be pinned on one env."""

    def __init__(self, shared):
        self.shared = shared

    def set(self, value: int | None) -> None:
        self.shared.value = -1 if value is None else value

    def get(self) -> int | None:
        return None if self.shared.value < 0 else int(self.shared.value)


def _sigterm_handler(parent: int, stopping):
    """SIGTERM unwinds the worker, so that its envs are closed and the game processes they started go
    with them, when the parent asks (``stopping``, set before its ``terminate()``) or is gone. A
    SIGTERM to the whole process group (``timeout``, Slurm, systemd, ``kill -TERM -- -PGID``) reaches
    the parent too, which stops at its next consistent point and then closes the workers in order:
    the worker carries on until then, as it does on a terminal's Ctrl+C."""
    def handler(signum, frame):
        if stopping.value or os.getppid() != parent:
            raise SystemExit(128 + signum)
    return handler


class _Commands:
    """What an env worker answers, one method per command the parent sends (``(name, arg)``), each
    returning the reply. The worker's envs are ``envs`` (``indices`` in the parent's numbering);
    ``busy`` names the env being worked on, ``ticks`` counts the envs stepped (a job stepping for
    long is not hung)."""

    def __init__(self, envs: list, indices: list[int], busy: _Current, ticks):
        self.envs, self.indices, self.busy, self.ticks = envs, indices, busy, ticks
        self.arrays: StepArrays | None = None
        # the worker's envs as a vector env of their own, that counted (what the job steps), and the job
        self.local = self.hosted = self.job = None

    def _on_env(self, i: int | None) -> None:
        self.busy.set(self.indices[i] if i is not None else None)
        self.ticks.value += 1

    def attach(self, arg) -> None:
        names, spec, shapes, num_envs = arg
        blocks = {k: _attach(n) for k, n in names.items()}
        self.arrays = StepArrays(spec, num_envs, shapes, blocks)
        self.arrays.shm = list(blocks.values())

    def reset(self, seeds: list) -> None:
        for env, e, seed in zip(self.envs, self.indices, seeds):
            self.busy.set(e)
            self.arrays.write_obs("next", e, env.reset(seed=seed))
        self.busy.set(None)

    def step(self, _) -> dict:
        """-> the ``episode_stats()`` of the envs whose episode ended."""
        ended = {}
        for env, e in zip(self.envs, self.indices):
            self.busy.set(e)
            ob, reward, terminated, truncated, done = env.step(self.arrays.actions(e))
            if done:
                ended[e] = env.episode_stats()
            self.arrays.write_step(e, ob, reward, terminated, truncated, done, env.reset() if done else None)
        self.busy.set(None)
        return ended

    def install(self, arg) -> None:
        self.job, counting = arg   # counting: the episode statistics of these envs, or None
        self.local = SyncVectorEnv.hosting(self.envs, self._on_env)
        self.hosted = counting.around(self.local) if counting is not None else self.local
        self.job.install(self.hosted)

    def run(self, arg):
        return self.job.run(arg)

    def render(self, index: int):
        self.busy.set(index)
        frame = self.envs[self.indices.index(index)].render()
        self.busy.set(None)
        return frame

    def state_dict(self, _) -> list:
        return [dumps_state(env) for env in self.envs]

    def load_state_dict(self, blobs: list) -> bool:
        self.envs, restored = loads_states(self.envs, blobs)
        if self.local is not None:
            self.local.envs = self.envs
        return restored

    def counter(self, _):
        return self.hosted.counter

    def load_counter(self, counter) -> None:
        self.hosted.counter = counter

    def close(self) -> None:
        for env in self.envs:
            try:
                env.close()
            except Exception:
                pass
        if self.arrays is not None:
            self.arrays.release(unlink=False)


def _worker(conn, env_fns: list, indices: list[int], busy, ticks, stopping, inherited: list) -> None:
    # The parent owns Ctrl+C and SIGTERM to the group: it stops the workers in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _sigterm_handler(os.getppid(), stopping))
    # a forked worker holds copies of the parent's ends of its own pipe and its elder siblings':
    # closed, so that each pipe reaches EOF here when the parent is gone (closed through their
    # Connection objects, which then cannot close a later file that reuses the number)
    for parent_end in inherited:
        parent_end.close()
    commands = _Commands([], indices, _Current(busy), ticks)
    try:
        for i, fn in zip(indices, env_fns):
            commands.busy.set(i)
            commands.envs.append(fn())
        commands.busy.set(None)
        conn.send(("ok", commands.envs[0].spec))
        while True:
            try:
                name, arg = conn.recv()
            except (EOFError, OSError):  # the parent is gone
                break
            if name == "close":
                break
            reply = getattr(commands, name)(arg)
            # a plain pickle: torch's reductions for this pipe would send a job's tensors as file descriptors
            conn.send_bytes(pickle.dumps(("ok", reply), pickle.HIGHEST_PROTOCOL))
    except (KeyboardInterrupt, SystemExit):
        pass
    except BaseException as exc:
        # a bad setting is the same in every env and its message names the fix: it goes to the
        # parent as itself, not as a worker failure with a traceback
        config_error = exc if isinstance(exc, ConfigError) else None
        try:
            conn.send(("error", (commands.busy.get(), f"{type(exc).__name__}: {exc}", traceback.format_exc(),
                                 config_error)))
        except (BrokenPipeError, OSError):
            pass
    finally:
        commands.close()
        conn.close()


STARTING = ("creating the env", "installing a job")   # what runner.worker_start_timeout bounds


class SubprocVectorEnv(WorkerVectorEnv):
    """Envs spread over ``num_workers`` processes (each hosts ``E / num_workers`` envs in turn, in
    whole blocks of ``align`` consecutive envs: a job acting on blocks of that many envs then acts on
    the blocks it would act on over all the envs)."""

    def __init__(self, env_fns: list[EnvFactory], num_workers: int | None = None, timeout: float = 60.0,
                 start_method: str = "auto", start_timeout: float = 120.0, align: int = 1):
        start_method = resolve_start_method(start_method)
        if start_method != "fork":
            check_main_guarded("env worker processes (runner.vectorize: subprocess or auto)",
                               instead="set runner.vectorize: sync")
        self.num_envs = len(env_fns)
        blocks = [list(range(first, min(first + align, self.num_envs))) for first in range(0, self.num_envs, align)]
        num_workers = min(num_workers or os.cpu_count() or 1, len(blocks))
        self.timeout, self.start_timeout = timeout, start_timeout
        self.closed = False
        self.arrays = None
        self.in_flight: set[int] = set()   # workers stepping since a step_async, not yet waited for
        shares = np.array_split(np.arange(len(blocks)), num_workers)   # each worker's blocks
        self.indices = [[env for b in share for env in blocks[b]] for share in shares]
        ctx = mp.get_context(start_method)
        self.conns, self.procs, self.busy, self.ticks, self.pollers = [], [], [], [], []
        self.stopping = ctx.RawValue("b", 0)   # set before the workers are terminated (_sigterm_handler)
        OPEN_VECTOR_ENVS.add(self)
        try:
            for idx in self.indices:
                parent, child = ctx.Pipe()
                busy, ticks = ctx.RawValue("i", -1), ctx.RawValue("Q", 0)
                self.busy.append(busy)
                self.ticks.append(ticks)
                inherited = self.conns + [parent] if start_method == "fork" else []
                proc = ctx.Process(target=_worker, args=(child, [env_fns[i] for i in idx], idx, busy, ticks,
                                                         self.stopping, inherited),
                                   daemon=False, name=f"marlkit-env-{idx[0]}-{idx[-1]}")
                proc.start()
                child.close()
                # one poll object per pipe: Connection.poll builds a selector per call, which costs
                # as much as the rest of a small env's step round trip
                poller = select.poll()
                poller.register(parent.fileno(), select.POLLIN)
                self.pollers.append(poller)
                self.conns.append(parent)
                self.procs.append(proc)
            specs = self._gather(range(num_workers), "creating the env", start_timeout)
            self.spec = specs[0]
            shapes = action_shapes(self.spec)
            self.arrays = StepArrays.shared(self.spec, self.num_envs, shapes)
            self._broadcast("attach", (self.arrays.names, self.spec, shapes, self.num_envs))
            self._gather(range(num_workers), "attaching shared memory")
        except BaseException:
            self.close()
            raise

    def _describe(self, w: int) -> str:
        idx = self.indices[w]
        return f"env {idx[0]}" if len(idx) == 1 else f"envs {idx[0]}-{idx[-1]}"

    def _culprit(self, w: int) -> str:
        busy, pid = self.busy[w].value, self.procs[w].pid
        if busy >= 0:
            return f"env {busy} (worker of {self._describe(w)}, pid {pid})"
        return f"the worker of {self._describe(w)} (pid {pid})"

    def _died(self, w: int, what: str) -> EnvWorkerError:
        self.procs[w].join(1.0)
        return EnvWorkerError(f"{self._culprit(w)} died with exit code {self.procs[w].exitcode} while {what}")

    def _receive(self, w: int, what: str, timeout: float | None = None, progress: bool = False):
        """The worker's reply; ``timeout`` is how long it may go without one or, with ``progress``
        (a job stepping its envs many times), without stepping an env."""
        conn, proc, poller = self.conns[w], self.procs[w], self.pollers[w]
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        ticks = self.ticks[w].value
        while not poller.poll(50):   # also wakes when the worker's end closes; recv then says EOF
            if not proc.is_alive() and not conn.poll(0):
                raise self._died(w, what)
            if progress and self.ticks[w].value != ticks:
                ticks, deadline = self.ticks[w].value, time.monotonic() + timeout
            elif time.monotonic() > deadline:
                setting = "runner.worker_start_timeout" if what in STARTING else "runner.worker_timeout"
                raise EnvWorkerError(f"{self._culprit(w)} did not answer within {timeout:g} s while {what} "
                                     f"({setting})")
        try:
            status, payload = conn.recv()
        except (EOFError, OSError):
            raise self._died(w, what) from None
        if status == "error":
            env_index, summary, tb, config_error = payload
            if config_error is not None:
                raise config_error
            where = f"env {env_index}" if env_index is not None else self._describe(w)
            raise EnvWorkerError(f"{where} raised while {what}: {summary}", worker_traceback=tb)
        return payload

    def _gather(self, workers, what: str, timeout: float | None = None, progress: bool = False) -> list:
        try:
            return [self._receive(w, what, timeout, progress) for w in workers]
        except BaseException:
            self.close(grace=1.0)
            raise

    def _broadcast(self, cmd: str, arg=None, per_worker: list | None = None, workers: range | None = None) -> None:
        """``cmd`` to every worker, or to ``workers`` (with ``arg``, or ``per_worker[w]`` each)."""
        if self.in_flight and cmd != "step":
            raise RuntimeError(f"{cmd!r} while the workers {sorted(self.in_flight)} have a step in flight: "
                               "step_wait for it first")
        same = pickle.dumps((cmd, arg), pickle.HIGHEST_PROTOCOL) if per_worker is None else None
        for w in workers if workers is not None else range(len(self.conns)):
            conn = self.conns[w]
            message = same if same is not None else pickle.dumps((cmd, per_worker[w]), pickle.HIGHEST_PROTOCOL)
            try:
                conn.send_bytes(message)
            except (BrokenPipeError, OSError):
                self._gather([w], f"sending {cmd!r}")
                raise EnvWorkerError(f"the worker of {self._describe(w)} is gone (sending {cmd!r})")

    def reset(self, seed: int | None = None) -> Observation:
        seeds = env_seeds(seed, self.num_envs)
        self._broadcast("reset", per_worker=[[seeds[i] for i in idx] for idx in self.indices])
        self._gather(range(len(self.conns)), "resetting")
        return self.arrays.observation("next")

    def step(self, actions: dict[str, np.ndarray]) -> StepResult:
        self.step_async(actions)
        return self.step_wait()

    def splits(self, n: int) -> list[tuple[int, int]]:
        """The envs in ``n`` parts of whole workers, as (first env, count): parts that
        ``step_async`` steps while others wait (double-buffered collection)."""
        if not 1 <= n <= len(self.conns):
            raise ValueError(f"{n} parts of the envs of {len(self.conns)} env workers: each part needs a worker")
        parts = np.array_split(np.arange(len(self.conns)), n)
        return [(self.indices[ws[0]][0], sum(len(self.indices[w]) for w in ws)) for ws in parts]

    def _workers_of(self, envs: tuple[int, int] | None) -> range:
        if envs is None:
            return range(len(self.conns))
        first, count = envs
        workers = [w for w, idx in enumerate(self.indices) if first <= idx[0] < first + count]
        if not workers or self.indices[workers[0]][0] != first or self.indices[workers[-1]][-1] != first + count - 1:
            raise ValueError(f"envs {first}-{first + count - 1} are not whole workers' envs (see splits())")
        return range(workers[0], workers[-1] + 1)

    def step_async(self, actions: dict[str, np.ndarray], envs: tuple[int, int] | None = None) -> None:
        """Start stepping the envs ``envs`` = (first, count), whole workers' (all: None), with
        ``actions`` ``[count, A_g, ...]``; ``step_wait(envs)`` returns their result. Other workers
        may step meanwhile: each writes only its own envs' rows of the shared arrays."""
        rows = slice(None) if envs is None else slice(envs[0], envs[0] + envs[1])
        workers = self._workers_of(envs)
        if self.in_flight.intersection(workers):
            raise RuntimeError(f"step_async of envs {envs} while their step is in flight: step_wait for it first")
        for g, a in actions.items():
            self.arrays.a[f"action.{g}"][rows] = a
        self._broadcast("step", workers=workers)
        self.in_flight.update(workers)

    def step_wait(self, envs: tuple[int, int] | None = None) -> StepResult:
        """The result of the step ``step_async(..., envs)`` started, for those envs (indexed from 0)."""
        workers = self._workers_of(envs)
        if not self.in_flight.issuperset(workers):
            raise RuntimeError(f"step_wait of envs {envs}, which step_async did not start")
        self.in_flight.difference_update(workers)
        replies = self._gather(workers, "stepping")   # per worker: its ended envs' stats
        ended = {e: stats for reply in replies for e, stats in reply.items()}
        return self._finish(self.arrays, ended, *(envs or (0, self.num_envs)))

    def render(self, index: int = 0):
        w = next(w for w, idx in enumerate(self.indices) if index in idx)
        self.conns[w].send(("render", index))
        return self._gather([w], "rendering")[0]

    # ------------------------------------------------------------------ jobs on the workers' own envs

    @property
    def blocks(self) -> list[tuple[int, int]]:
        """Per worker, (its first env, how many envs it hosts): consecutive blocks in env order."""
        return [(idx[0], len(idx)) for idx in self.indices]

    def install_jobs(self, jobs: list, counting: list | None = None) -> None:
        """Give each worker a job (picklable; ``jobs[w]`` for the envs of ``blocks[w]``) that runs on
        its envs in the worker: ``job.install(venv)`` once, with the worker's envs as a vector env of
        its own, then ``job.run(arg)`` per ``run_jobs``. ``counting[w]``: the episode statistics
        (``EpisodeStatistics.rows``) the worker puts around its vector env, and keeps from now on.
        The envs layer knows nothing of what a job does."""
        counting = counting or [None] * len(jobs)
        self._broadcast("install", per_worker=list(zip(jobs, counting)))
        # a spawned worker imports what the jobs need (torch) as it unpickles them: start-up time
        self._gather(range(len(self.conns)), "installing a job", self.start_timeout)

    def run_jobs(self, args: list, what: str) -> list:
        """``job.run(args[w])`` in every worker at once -> their results, in worker order. A worker
        that steps none of its envs for ``runner.worker_timeout`` seconds is an error."""
        self._broadcast("run", per_worker=args)
        return self._gather(range(len(self.conns)), what, progress=True)

    def state_dict(self) -> list[bytes | None]:
        self._broadcast("state_dict")
        per_worker = self._gather(range(len(self.conns)), "saving env state")
        blobs: list[bytes | None] = [None] * self.num_envs
        for idx, worker_blobs in zip(self.indices, per_worker):
            for i, blob in zip(idx, worker_blobs):
                blobs[i] = blob
        return blobs

    def load_state_dict(self, blobs: list[bytes]) -> bool:
        self._broadcast("load_state_dict", per_worker=[[blobs[i] for i in idx] for idx in self.indices])
        return all(self._gather(range(len(self.conns)), "restoring env state"))

    def hosted_counters(self) -> list:
        self._broadcast("counter")
        return self._gather(range(len(self.conns)), "saving episode statistics")

    def load_hosted_counters(self, counters: list) -> None:
        self._broadcast("load_counter", per_worker=counters)
        self._gather(range(len(self.conns)), "restoring episode statistics")

    def close(self, grace: float | None = None) -> None:
        """Ask workers to close their envs; after ``grace`` seconds (default: the step timeout, at
        most 30 s) terminate, then kill, what is left."""
        if self.closed:
            return
        self.closed = True
        OPEN_VECTOR_ENVS.discard(self)
        for conn in self.conns:
            try:
                conn.send(("close", None))
            except (BrokenPipeError, OSError):
                pass
        deadline = time.monotonic() + (grace if grace is not None else min(self.timeout, 30.0))
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                self.stopping.value = 1
                proc.terminate()
                proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        for conn in self.conns:
            conn.close()
        if self.arrays is not None:
            self.arrays.release(unlink=True)


def resolve_start_method(method: str) -> str:
    """``auto``: ``fork`` on Linux in a process with no other Python thread where torch, if imported,
    computes on one thread and has not set up CUDA (a forked worker starts at once, with the modules
    already imported, torch's among them), else ``spawn``: macOS's system libraries are not safe to
    fork; another thread may hold a lock the child would wait on forever; the OpenMP thread pool of
    torch's CPU kernels (GNU's, in its wheels) does not exist in a forked child that still believes
    it does; and CUDA cannot be set up again in one."""
    if method != "auto":
        return method
    if not sys.platform.startswith("linux") or threading.active_count() > 1:
        return "spawn"
    torch = sys.modules.get("torch")   # not imported here: the envs layer does not need it
    if torch is not None and (torch.get_num_threads() > 1 or torch.cuda.is_initialized()):
        return "spawn"
    return "fork"

"""A lockstep network game of N players, one worker process (and engine) per player.

``player_0`` hosts on a free UDP port and the others join it over loopback. Every call sends one
command to every worker and waits for all answers; a worker that dies or does not answer within
``timeout`` seconds becomes a :class:`DoomPlayerError` naming the env and the player, after the
whole match has been torn down (the survivors would otherwise block forever, each spinning a core).
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import shutil
import socket
import tempfile
import time
from dataclasses import replace
from multiprocessing.connection import wait

from marlkit.envs import ports, processes
from marlkit.envs.doom import worker
from marlkit.envs.doom.worker import PlayerSettings
from marlkit.envs.main_guard import check_main_guarded

log = logging.getLogger("marlkit.doom")


class DoomPlayerError(RuntimeError):
    """A player's worker or engine died, hung or failed; the message names the env and player."""


def free_port() -> int:
    """A UDP port for the host (all interfaces), outside the range the joiners' sockets draw from;
    should another process take it before the host binds it, :meth:`DoomMatch.start` retries."""
    return ports.free_port(socket.SOCK_DGRAM, "0.0.0.0")


def _state(pid: int) -> str | None:
    """The process state letter from /proc (R running, S sleeping, T stopped, Z zombie), None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _fault(worker_pid: int) -> str:
    """What is wrong with a player that does not answer, as far as the OS can tell: its worker or
    its engine (the other member of the worker's process group) stopped or gone; '' if nothing."""
    if _state(worker_pid) in ("T", "t"):
        return "is stopped"
    try:
        engines = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != worker_pid
                   and _pgid(int(p)) == worker_pid]
    except OSError:   # no /proc: nothing more to tell
        return ""
    if not engines or all(_state(p) in (None, "Z") for p in engines):
        return "has lost its engine"
    if any(_state(p) in ("T", "t") for p in engines):
        return "has a stopped engine"
    return ""


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


class DoomMatch:
    """``start()`` the players, then ``reset(seed)`` / ``step(actions, tics)`` them in lockstep.

    ``settings`` is player 0's; the others get the same with their own index. ``port`` None picks a
    free port for every start; a fixed port is used as given (a second match on it fails)."""

    def __init__(self, settings: PlayerSettings, name: str = "env 0", port: int | None = None,
                 timeout: float = 10.0, start_timeout: float = 30.0, start_attempts: int = 3):
        self.settings, self.name, self.port = settings, name, port
        self.timeout, self.start_timeout, self.start_attempts = timeout, start_timeout, start_attempts
        self.procs: list = []
        self.conns: list = []
        self.pgids: list[int] = []
        self.work_dir: str | None = None
        self.info: list[dict] = []
        self.current_port: int | None = None   # the port of the running match

    @property
    def players(self) -> int:
        return self.settings.players

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    # ------------------------------------------------------------------ start / stop

    def start(self) -> None:
        """Start every player; retried on a new port when the host could not bind (the engine then
        crashes inside init(), which the client library turns into a segfault of the worker)."""
        errors = []
        attempts = self.start_attempts if self.port is None else 1
        for attempt in range(attempts):
            port = self.port if self.port is not None else free_port()
            try:
                self._start_once(port)
                self.current_port = port
                return
            except DoomPlayerError as exc:
                errors.append(str(exc))
                if attempt + 1 < attempts:
                    log.warning("%s: the match did not start on port %d (%s); retrying on another port",
                                self.name, port, str(exc).splitlines()[0])
        raise DoomPlayerError(f"{self.name}: the match did not start after {len(errors)} attempt(s); "
                              f"last error: {errors[-1]}")

    def _start_once(self, port: int) -> None:
        check_main_guarded("ViZDoom's player processes")
        ctx = mp.get_context("spawn")
        self.work_dir = tempfile.mkdtemp(prefix="marlkit-doom-")
        barrier = ctx.Barrier(self.players)
        try:
            for i in range(self.players):
                parent, child = ctx.Pipe()
                s = replace(self.settings, player=i, port=port, work_dir=self.work_dir,
                            barrier_timeout=self.timeout)
                proc = ctx.Process(target=worker.run, args=(child, s, barrier, os.getpid()), daemon=True,
                                   name=f"marlkit-doom-{self.name.replace(' ', '')}-p{i}")
                proc.start()
                child.close()
                self.procs.append(proc)
                self.pgids.append(proc.pid)
                self.conns.append(parent)
            self.info = self._gather("starting (port %d)" % port, self.start_timeout, expect="ready")
        except BaseException:
            self.close()
            raise

    def close(self, grace: float = 2.0) -> None:
        """Ask the workers to close their games; kill the process groups of what is left."""
        for conn in self.conns:
            try:
                conn.send(("close", None))
            except OSError:
                pass
        deadline = time.monotonic() + grace
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for pgid in self.pgids:
            processes.kill_group(pgid)
        for proc in self.procs:
            proc.join(1.0)
        for conn in self.conns:
            conn.close()
        self.procs, self.conns, self.pgids = [], [], []
        self.current_port = None
        if self.work_dir is not None:
            shutil.rmtree(self.work_dir, ignore_errors=True)
            self.work_dir = None

    # ------------------------------------------------------------------ lockstep calls

    def _player(self, i: int) -> str:
        pid = self.procs[i].pid if i < len(self.procs) else None
        return f"player_{i} (pid {pid})"

    def _who(self, i: int) -> str:
        return f"{self.name}: {self._player(i)}"

    def _fail(self, message: str, player: int | None = None) -> DoomPlayerError:
        tail = self._log_tail(player) if player is not None else ""
        self.close(grace=0.0)
        return DoomPlayerError(message + (f"\nlast engine output of player_{player}:\n{tail}" if tail else ""))

    def _log_tail(self, player: int, lines: int = 6) -> str:
        try:
            with open(worker.log_path(self.work_dir, player), errors="replace") as f:
                text = f.read()[-4000:]
        except (OSError, TypeError):
            return ""
        kept = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
        return "\n".join("  " + line for line in kept[-lines:])

    def _gather(self, what: str, timeout: float, expect: str = "ok") -> list:
        """One answer from every player. Waits on all pipes and process sentinels at once: in
        lockstep a player that dies or hangs blocks all the others, so every silent player is
        watched, and the one at fault (dead, stopped, or with a dead engine) is the one named."""
        deadline = time.monotonic() + timeout
        out: list = [None] * len(self.conns)
        pending = set(range(len(self.conns)))
        while pending:
            wait([self.conns[i] for i in pending] + [self.procs[i].sentinel for i in pending],
                 max(0.0, min(0.5, deadline - time.monotonic())))
            for i in sorted(pending):
                conn, proc = self.conns[i], self.procs[i]
                if conn.poll(0):
                    try:
                        status, payload = conn.recv()
                    except (EOFError, OSError):
                        proc.join(0.5)
                        raise self._fail(f"{self._who(i)} died with exit code {proc.exitcode} while {what}",
                                         i) from None
                    if status == "error":
                        raise self._fail(f"{self._who(i)} failed while {what}: {payload}", i)
                    if status != expect:
                        raise self._fail(f"{self._who(i)} answered {status!r} while {what}")
                    out[i] = payload
                    pending.discard(i)
                elif not proc.is_alive():
                    proc.join(0.1)
                    raise self._fail(f"{self._who(i)} died with exit code {proc.exitcode} while {what}", i)
            if pending and time.monotonic() >= deadline:
                raise self._timeout(sorted(pending), what, timeout)
        return out

    def _timeout(self, silent: list[int], what: str, timeout: float) -> DoomPlayerError:
        faults = {i: _fault(self.procs[i].pid) for i in silent}
        culprits = [i for i in silent if faults[i]] or silent
        named = ", ".join(f"{self._player(i)}{' ' + faults[i] if faults[i] else ''}" for i in culprits)
        waiting = [f"player_{i}" for i in silent if i not in culprits]
        return self._fail(f"{self.name}: {named} and did not answer within {timeout:g} s while {what} "
                          "(env.player_timeout)" + (f"; {', '.join(waiting)} waited on it" if waiting else "")
                          + "; the match was stopped", culprits[0])

    def _call(self, cmd: str, args: list, what: str) -> list:
        if not self.conns:
            raise DoomPlayerError(f"{self.name}: the match is not running")
        for i, (conn, arg) in enumerate(zip(self.conns, args)):
            try:
                conn.send((cmd, arg))
            except OSError:
                proc = self.procs[i]
                proc.join(0.5)
                raise self._fail(f"{self._who(i)} died with exit code {proc.exitcode} while {what}", i) from None
        return self._gather(what, self.timeout)

    def reset(self, seed: int | None = None) -> list:
        """New episode for every player; per player ``(screen, variables, finished)``."""
        return self._call("reset", [seed] * self.players, "starting an episode")

    def step(self, buttons: list[list[float]], tics: int) -> list:
        """Every player presses its buttons for ``tics`` tics; per player ``(screen, variables, finished)``."""
        return self._call("step", [(b, tics) for b in buttons], "stepping")

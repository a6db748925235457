"""A lockstep network game of N players, one worker process (and engine) per player.

``player_0`` hosts on a free UDP port and the others join it over loopback. Every call sends one
command to every worker and waits for all answers; a worker that dies or does not answer within
``timeout`` seconds becomes a :class:`DoomPlayerError` naming the env and the player, after the
whole match has been torn down (the survivors would otherwise block forever, each spinning a core).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import socket
import tempfile
import time
from dataclasses import replace

from marlkit.envs.doom import worker
from marlkit.envs.doom.worker import PlayerSettings


class DoomPlayerError(RuntimeError):
    """A player's worker or engine died, hung or failed; the message names the env and player."""


def free_port() -> int:
    """A UDP port nobody holds right now (another process may take it before the host binds it,
    which :meth:`DoomMatch.start` detects and retries)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("0.0.0.0", 0))
        return sock.getsockname()[1]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
        for attempt in range(self.start_attempts if self.port is None else 1):
            try:
                self._start_once(self.port if self.port is not None else free_port())
                return
            except DoomPlayerError as exc:
                errors.append(str(exc))
        raise DoomPlayerError(f"{self.name}: the match did not start after {len(errors)} attempt(s); "
                              f"last error: {errors[-1]}")

    def _start_once(self, port: int) -> None:
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
            if _group_alive(pgid):
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            proc.join(1.0)
        for conn in self.conns:
            conn.close()
        self.procs, self.conns, self.pgids = [], [], []
        if self.work_dir is not None:
            shutil.rmtree(self.work_dir, ignore_errors=True)
            self.work_dir = None

    # ------------------------------------------------------------------ lockstep calls

    def _who(self, i: int) -> str:
        pid = self.procs[i].pid if i < len(self.procs) else None
        return f"{self.name}: player_{i} (pid {pid})"

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
        deadline = time.monotonic() + timeout
        out = []
        for i, (conn, proc) in enumerate(zip(self.conns, self.procs)):
            while not conn.poll(0.02):
                if not proc.is_alive() and not conn.poll(0):
                    proc.join(0.1)
                    raise self._fail(f"{self._who(i)} died with exit code {proc.exitcode} while {what}", i)
                if time.monotonic() > deadline:
                    raise self._fail(f"{self._who(i)} did not answer within {timeout:g} s while {what} "
                                     "(env.player_timeout); the match was stopped", i)
            try:
                status, payload = conn.recv()
            except (EOFError, OSError):
                proc.join(0.5)
                raise self._fail(f"{self._who(i)} died with exit code {proc.exitcode} while {what}", i) from None
            if status == "error":
                raise self._fail(f"{self._who(i)} failed while {what}: {payload}", i)
            if status != expect:
                raise self._fail(f"{self._who(i)} answered {status!r} while {what}")
            out.append(payload)
        return out

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

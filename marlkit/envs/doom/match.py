"""A lockstep network game of N players, one worker process (and engine) per player.

``player_0`` hosts on a free UDP port and the others join it over loopback. Every call sends one
command to every worker and waits for all answers; a worker that dies or does not answer within
``timeout`` seconds becomes a :class:`DoomPlayerError` naming the env and the player, after the
whole match has been torn down (the survivors would otherwise block forever, each spinning a core).

Each match has a keeper process (``keeper.py``): it holds the match's network namespace, where the
system allows one, so that the engines' UDP sockets can be reached by the match's players alone,
and it removes the match's work folder should this process die without closing the match. Work
folders are named after the process that made them (pid and start time), so that a start removes
those whose process is gone and whose keeper could not remove them (killed along with it).
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from multiprocessing.connection import wait

from marlkit.envs import ports, processes
from marlkit.envs.doom import keeper, worker
from marlkit.envs.doom.worker import PlayerSettings
from marlkit.envs.main_guard import check_main_guarded

log = logging.getLogger("marlkit.doom")

WORK_PREFIX = "marlkit-doom-"
_WORK_NAME = re.compile(re.escape(WORK_PREFIX) + r"(\d+)-(\d+)-\w+")
# why this process's matches share the machine's network; the first refusal is logged, and later
# matches do not try again
_shared_because: str | None = None


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
    if not os.path.isdir("/proc"):   # nothing more to tell
        return ""
    engines = [p for p in processes.group_members(worker_pid) if p != worker_pid]
    if not engines or all(_state(p) in (None, "Z") for p in engines):
        return "has lost its engine"
    if any(_state(p) in ("T", "t") for p in engines):
        return "has a stopped engine"
    return ""


def _started(pid: int) -> int | None:
    """A process's start time (clock ticks after boot): with its pid, a name no later process has."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def sweep_work_folders() -> None:
    """Remove the work folders of this user whose process is gone (killed with its keeper)."""
    if _started(os.getpid()) is None:   # no /proc: a live owner could not be told from a dead one
        return
    try:
        entries = list(os.scandir(tempfile.gettempdir()))
    except OSError:
        return
    for entry in entries:
        name = _WORK_NAME.fullmatch(entry.name)
        try:
            stale = (name is not None and entry.is_dir(follow_symlinks=False)
                     and entry.stat(follow_symlinks=False).st_uid == os.geteuid()
                     and _started(int(name[1])) != int(name[2]))
        except OSError:
            continue
        if stale:
            keeper.release(entry.path)
            shutil.rmtree(entry.path, ignore_errors=True)


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
        self.keeper: tuple[int, int] | None = None   # the keeper's pid and start time
        self._keeper_stdin = None
        self.isolated = False   # the running match has a network of its own
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
        sweep_work_folders()
        self.work_dir = tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{os.getpid()}-{_started(os.getpid()) or 0}-")
        barrier = ctx.Barrier(self.players)
        try:
            network = self._start_keeper()
            for i in range(self.players):
                parent, child = ctx.Pipe()
                s = replace(self.settings, player=i, port=port, work_dir=self.work_dir,
                            barrier_timeout=self.timeout, network=network)
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

    def _start_keeper(self) -> tuple[int, int] | None:
        """Start the match's keeper; (its pid, its network namespace) where the match has a network
        of its own, else None, logged once per process with the reason."""
        global _shared_because
        command = [sys.executable, "-I", "-S", keeper.__file__, "keep", self.work_dir,
                   "share" if _shared_because else "isolate"]
        # started through a shell that leaves it at once, so that it is no child of this process:
        # Ray kills the children of an actor that dies, and the keeper has to outlive it (the shell
        # gives a job in the background /dev/null for stdin, unless told otherwise)
        starter = subprocess.Popen(["/bin/sh", "-c", 'exec 3<&0; exec "$@" <&3 3<&- &', "sh", *command],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                   start_new_session=True)
        starter.wait()
        self._keeper_stdin = starter.stdin
        ready, _, _ = select.select([starter.stdout], [], [], self.start_timeout)
        answer = starter.stdout.readline().decode(errors="replace").split(maxsplit=2) if ready else []
        starter.stdout.close()
        if len(answer) < 2:
            raise DoomPlayerError(f"{self.name}: the match's keeper process did not start within "
                                  f"{self.start_timeout:g} s")
        self.keeper = (int(answer[0]), _started(int(answer[0])))
        self.isolated = answer[1] == "isolated"
        if self.isolated:
            return self.keeper[0], int(answer[2])
        if _shared_because is None:
            _shared_because = answer[2].strip() if len(answer) > 2 else "not permitted"
            log.warning("ViZDoom's engines listen on UDP on every interface, and this system allows their matches "
                        "no network of their own (%s): while a match runs, anyone who can reach this machine can "
                        "reach its UDP ports and join it; allow user namespaces (sysctl user.max_user_namespaces, "
                        "kernel.unprivileged_userns_clone) or firewall UDP from outside", _shared_because)
        return None

    def _stop_keeper(self) -> None:
        if self._keeper_stdin is None:
            return
        self._keeper_stdin.close()   # its cue to go (and to remove what is left of the folder)
        self._keeper_stdin = None
        if self.keeper is not None:
            pid, started = self.keeper
            deadline = time.monotonic() + 5.0
            while _state(pid) not in (None, "Z", "X") and _started(pid) == started:
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    break
                time.sleep(0.01)
        self.keeper = None
        self.isolated = False

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
        # a player still running may have created its queues without its engine's id on record
        held = set()
        try:
            for pgid in self.pgids:
                held |= keeper.held(processes.pause_group(pgid))
        finally:
            for pgid in self.pgids:
                processes.kill_group(pgid)
        keeper.unlink(held)
        for proc in self.procs:
            proc.join(1.0)
        for conn in self.conns:
            conn.close()
        self.procs, self.conns, self.pgids = [], [], []
        self.current_port = None
        if self.work_dir is not None:
            keeper.release(self.work_dir)
            shutil.rmtree(self.work_dir, ignore_errors=True)
            self.work_dir = None
        self._stop_keeper()

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

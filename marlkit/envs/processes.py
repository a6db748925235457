"""Processes that env adapters launch (a Unity build), and the guarantee that none outlives the
process that launched it, however that one ends.

A launched process leads a session, hence a process group, of its own: one ``killpg`` removes it
with every child it started (a launcher script and the game it runs), and a terminal's Ctrl+C
reaches marlkit alone, which then stops its processes in order. Each group is recorded from the
moment it exists:

- :func:`launch` holds SIGINT and SIGTERM back while the process starts and is recorded, so that
  an interrupt at that moment unwinds a caller that already holds the process; the process runs
  its command only once recorded, and never if the launching process dies before;
- a watcher process, one per launching process and started with its first launch, is told every
  group; when the launching process is gone (an exception, SIGTERM, SIGKILL, a plain exit without
  cleanup) its pipe closes and the watcher kills every group still recorded;
- :func:`stop` waits a grace period for the process to exit, then kills its group (children a
  launcher left behind included) and forgets it.

The watcher acts when the launching process is gone. An env worker, though, launches on behalf of
its parent: when that parent is killed while the worker waits for a scene to start, nothing will
ever use the scene, so the worker's waits include its :func:`lifeline` and end the worker at once;
its watcher then removes its groups.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

_WATCHER = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
groups = set()
for line in sys.stdin:
    pgid = int(line)
    if pgid > 0:
        groups.add(pgid)
    else:
        groups.discard(-pgid)
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""

_lock = threading.Lock()
_watcher: subprocess.Popen | None = None
_groups: set[int] = set()


def lifeline() -> int | None:
    """In a process that multiprocessing started (an env worker), a file descriptor that becomes
    readable (end of file) once the process that started it is gone, however it ended; None in
    any other process."""
    parent = multiprocessing.parent_process()
    return None if parent is None else parent.sentinel


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _stat(path: str) -> list[str] | None:
    """The fields of a /proc ``stat`` file after the command name (state first); None if gone."""
    try:
        with open(path) as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def group_members(pgid: int) -> list[int]:
    """The pids of process group ``pgid``, read from /proc (none without it)."""
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []
    return [pid for pid in pids if (fields := _stat(f"/proc/{pid}/stat")) is not None and fields[2] == str(pgid)]


def pause_group(pgid: int, timeout: float = 1.0) -> list[int]:
    """Stop every process of group ``pgid`` (SIGSTOP: it can start or create nothing more until it
    is killed) -> their pids. A thread stops once its system call returns, so this waits, up to
    ``timeout`` s, until every thread is stopped or gone: a file being created is then open."""
    try:
        os.killpg(pgid, signal.SIGSTOP)
    except (ProcessLookupError, PermissionError):
        return []
    members = group_members(pgid)
    deadline = time.monotonic() + timeout
    for pid in members:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            while ((fields := _stat(f"/proc/{pid}/task/{task}/stat")) is not None and fields[0] not in "TtZX"
                   and time.monotonic() < deadline):
                time.sleep(0.001)
    return members


def _tell(line: str) -> None:
    """One line to the watcher, starting one (told every recorded group) when there is none."""
    global _watcher
    for _ in range(2):
        if _watcher is None or _watcher.poll() is not None:
            _watcher = subprocess.Popen([sys.executable, "-I", "-S", "-c", _WATCHER], stdin=subprocess.PIPE,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
            line = "".join(f"{g}\n" for g in _groups) + line
        try:
            os.write(_watcher.stdin.fileno(), line.encode())
            return
        except OSError:   # the watcher was killed: start another
            _watcher = None


def _forget_after_fork() -> None:
    """A forked child owns none of its parent's processes: it drops its copy of the watcher's pipe
    (which would keep the watcher from seeing the parent go) and starts afresh."""
    global _watcher, _lock
    _lock = threading.Lock()
    if _watcher is not None and _watcher.stdin is not None:
        _watcher.stdin.close()
    _watcher = None
    _groups.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


@contextmanager
def _signals_held():
    """SIGINT and SIGTERM arriving inside the block act when it ends (main thread only, the one
    Python runs signal handlers in)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is not None:   # None: a handler not set from Python, left alone
            previous[signum] = signal.signal(signum, lambda s, _frame: arrived.append(s))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(arrived):
            signal.raise_signal(signum)


# The launched shell waits for a line on its stdin before it becomes ``args`` (whose stdin is then
# /dev/null): the process can start nothing until its group is recorded with the watcher, and if
# the launching process dies before that (the pipe closes without a line) it exits instead of
# running unwatched.
_GATE = 'read -r _ || exit 1; exec "$@" </dev/null'


def launch(args: list[str], **popen_kwargs) -> subprocess.Popen:
    """Start ``args`` in a session of its own, recorded with the watcher before it runs and before
    anything can interrupt the caller. Its stdin is /dev/null."""
    with _signals_held():
        gate_read, gate_write = os.pipe()
        try:
            proc = subprocess.Popen(["/bin/sh", "-c", _GATE, "marlkit-launch", *args], start_new_session=True,
                                    stdin=gate_read, **popen_kwargs)
        finally:
            os.close(gate_read)
        try:
            with _lock:
                _groups.add(proc.pid)
                _tell(f"{proc.pid}\n")
            os.write(gate_write, b"\n")
        finally:
            os.close(gate_write)
    return proc


def stop(proc: subprocess.Popen, grace: float) -> None:
    """Wait up to ``grace`` seconds for ``proc`` to exit, then kill its whole group and forget it."""
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    kill_group(proc.pid)
    proc.wait()
    with _lock:
        if proc.pid in _groups:
            _groups.discard(proc.pid)
            _tell(f"-{proc.pid}\n")

"""Kill processes when this one ends, however it ends (SIGKILL included, which runs no handler).

A shell blocks on a pipe whose only writer is this process (the descriptor is not inherited, so no
child holds it); when this process ends the read returns and the shell kills its targets. It
sleeps in ``read``, so it costs no CPU, and it lives in a session of its own, out of reach of a
terminal's Ctrl+C and of the process groups it may kill.
"""
from __future__ import annotations

import os
import subprocess

_SENTINELS: list[subprocess.Popen] = []   # kept: a Popen collected while running warns


def kill_when_gone(targets: list[int]) -> subprocess.Popen:
    """SIGKILL ``targets`` once this process is gone: pids, or negative pids for process groups.
    Returns the sentinel; ``disarm`` it once the targets end otherwise, before their pids can be
    reused."""
    read_end, _write_end = os.pipe()   # the write end stays open until this process ends
    try:
        sentinel = subprocess.Popen(
            ["/bin/sh", "-c", f"read -r _; kill -9 {' '.join(str(t) for t in targets)} 2>/dev/null"],
            stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    finally:
        os.close(read_end)
    _SENTINELS.append(sentinel)
    return sentinel


def disarm(sentinel: subprocess.Popen) -> None:
    sentinel.kill()
    sentinel.wait()
    _SENTINELS.remove(sentinel)

"""``python -m marlkit ARGS`` for the tests without Python's and torch's start-up every time (about
2.5 s of CPU a command, most of what a small run costs).

A server process imports what every marlkit process imports, once (as ``marlkit study``'s job
server does), and for each command forks a child that runs the ``marlkit`` package as
``python -m marlkit`` does (``runpy``: ``__main__``, ``sys.argv``), in a process of its own: its own
pid, signal handlers, exit code, working directory, environment, ``PYTHONPATH`` entries and
output files. At its end the child does what an interpreter does at exit (non-daemon threads
joined, ``atexit`` handlers, streams flushed). What only a freshly started interpreter shows is
tested with real ``python`` processes (tests/test_allocator.py, the signal tests).
"""
from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

SERVER = r'''
import json, os, runpy, sys, threading, traceback, atexit
import marlkit.api, torch.utils.tensorboard   # what every marlkit run imports


def run(request):
    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for entry in reversed([p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]):
            sys.path.insert(0, entry)
        stdin = os.open(os.devnull, os.O_RDONLY)
        out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        err = os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        for fd, to in ((stdin, 0), (out, 1), (err, 2)):
            os.dup2(fd, to)
            os.close(fd)
        sys.argv = ["marlkit", *request["argv"]]
        try:
            runpy.run_module("marlkit", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
            if not isinstance(exc.code, (int, type(None))):
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        run(request)
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"status": status}), flush=True)
'''

_server: subprocess.Popen | None = None
_lock = threading.Lock()


def _start() -> subprocess.Popen:
    global _server
    if _server is None or _server.poll() is not None:
        # started from this process's environment: what torch reads as it is imported
        # (ATEN_CPU_CAPABILITY under make test-exact) is the test process's
        _server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True, bufsize=1)
        atexit.register(_server.kill)
    return _server


def run_marlkit(args, env: dict, cwd=None, timeout: float = 300) -> subprocess.CompletedProcess:
    """As ``subprocess.run([sys.executable, "-m", "marlkit", *args], capture_output=True, text=True,
    env=env, cwd=cwd, timeout=timeout)``."""
    with _lock, tempfile.TemporaryDirectory(prefix="marlkit-cli-") as tmp:
        server = _start()
        out, err = Path(tmp) / "out", Path(tmp) / "err"
        server.stdin.write(json.dumps({"argv": [str(a) for a in args], "env": dict(env),
                                       "cwd": str(cwd or os.getcwd()), "out": str(out), "err": str(err)}) + "\n")
        server.stdin.flush()
        pid = json.loads(server.stdout.readline())["pid"]
        timer = threading.Timer(timeout, os.kill, (pid, 9))
        timer.start()
        try:
            status = json.loads(server.stdout.readline())["status"]
        finally:
            timed_out = not timer.is_alive()
            timer.cancel()
        stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
        argv = [sys.executable, "-m", "marlkit", *map(str, args)]
        if timed_out:
            raise subprocess.TimeoutExpired(argv, timeout, stdout, stderr)
        return subprocess.CompletedProcess(argv, os.waitstatus_to_exitcode(status), stdout, stderr)

"""``env.engine_wait``: how a ViZDoom engine waits for its peers' packets.

``spin`` is ViZDoom's own loop, which keeps a core busy while it waits. ``yield`` preloads a small
library (``engine_wait.c``, built here once per user and source with the system's C compiler) that
makes a waiting engine give its core to the processes with work to do; see the C file for why.
Where the library cannot be built (no compiler, not Linux), the engines spin, and a warning says
why and how to fix it.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

log = logging.getLogger("marlkit.doom")

SOURCE = Path(__file__).with_name("engine_wait.c")


@lru_cache(maxsize=None)
def library(compiler: str | None = None) -> str | None:
    """The path of the built library, or None (logged once) where it cannot be built. ``compiler``
    defaults to ``$CC``, else ``cc``."""
    if not sys.platform.startswith("linux"):
        return _cannot(f"preloading a library into the engines is done on Linux only, not {sys.platform}")
    compiler = compiler or os.environ.get("CC") or "cc"
    if shutil.which(compiler) is None:
        return _cannot(f"no C compiler {compiler!r} on PATH (install gcc, or set CC)")
    source = SOURCE.read_bytes()
    key = hashlib.sha1(source + compiler.encode()).hexdigest()[:12]
    # the user's own cache, not a shared /tmp: a library every engine loads must be no one else's to write
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "marlkit"
    target = cache / f"engine_wait-{key}.so"
    if target.is_file():
        return str(target)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache, suffix=".so.tmp")
    except OSError as exc:
        return _cannot(f"no cache folder to build it in ({exc})")
    os.close(fd)
    try:
        done = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", tmp, str(SOURCE), "-ldl"],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            return _cannot(f"{compiler} failed on {SOURCE.name}: {done.stderr.strip()[-500:]}")
        os.replace(tmp, target)   # atomic: matches starting side by side may build it at once
    except (OSError, subprocess.TimeoutExpired) as exc:
        return _cannot(f"{compiler} failed on {SOURCE.name}: {exc}")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return str(target)


def _cannot(why: str) -> None:
    log.warning("env.engine_wait: yield: %s; ViZDoom's engines spin while they wait for their peers, "
                "which slows a match on a busy machine (set env.engine_wait: spin to silence this)", why)
    return None

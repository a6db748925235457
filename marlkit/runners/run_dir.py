"""A run's directory: made when the run has something to keep, removed when a new run stops before its
first step, and where an error's traceback goes."""
from __future__ import annotations

import os
import shutil
import tempfile
from datetime import datetime
from pathlib import Path

from marlkit.config import RunConfig, save_config


def open_run_dir(cfg: RunConfig, run_dir: Path | None) -> Path:
    """``run_dir`` (a resumed run's), or a new one, with the resolved config written in it."""
    if run_dir is None:
        run_dir = new_run_dir(cfg, "_test" if cfg.mode == "test" else "")
    save_config(cfg, run_dir / "config.yaml")
    return run_dir


def new_run_dir(cfg: RunConfig, suffix: str = "") -> Path:
    """``<run_root>/<env>/<agent>/<YYYYmmdd-HHMMSS>_seed<k><suffix>``, made (a number follows the
    time where two runs start in the same second)."""
    base = Path(cfg.runner.run_root) / Path(cfg.env_name).stem / cfg.agent
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        path = base / f"{stamp}{f'-{n}' if n else ''}_seed{cfg.seed}{suffix}"
        try:
            path.mkdir(parents=True, exist_ok=False)
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"could not create a run directory under {base}")


def discard_run_dir(run_dir: Path, run_root: str) -> None:
    """A new run that stopped before its first step leaves nothing behind (its directory would hold
    a config and an empty events file, and look like a run): ``run_dir`` goes, unless it holds a
    checkpoint, and so do the ``<env>/<agent>/`` folders above it that it alone filled."""
    if any(run_dir.glob("*.pt")):
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    root = Path(run_root).resolve()
    for parent in run_dir.resolve().parents:
        if parent == root or root not in parent.parents or any(parent.iterdir()):
            break
        parent.rmdir()


def keep_traceback(exc: Exception, run_dir: Path | None) -> None:
    """An error's traceback that is not the user's to read (an env worker's, a scene's) goes to
    ``error.log`` in the run directory (or, for a run that left none, a temp file), so that the
    error itself stays one line that says where it is."""
    traceback = getattr(exc, "worker_traceback", None)
    if not traceback:
        return
    if run_dir is not None:
        path = run_dir / "error.log"
    else:
        fd, name = tempfile.mkstemp(prefix="marlkit-error-", suffix=".log")
        os.close(fd)
        path = Path(name)
    path.write_text(f"{type(exc).__name__}: {exc}\n\nworker traceback:\n{traceback}")
    exc.add_note(f"the worker's traceback is in {path}")

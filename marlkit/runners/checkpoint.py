"""Run checkpoints (``latest.pt``, ``best.pt``): every group's agent plus the runner's own state."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from marlkit.agents.base import CHECKPOINT_VERSION
from marlkit.errors import CheckpointMismatchError


def save_checkpoint(path: Path, payload: dict) -> None:
    """Write to a temp file in the same folder, then rename: a crash never leaves a torn file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        torch.save({"version": CHECKPOINT_VERSION, **payload}, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read(path: Path) -> dict:
    if not path.is_file():
        hint = " (a run directory holds latest.pt and best.pt)" if path.is_dir() else ""
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist{hint}")
    try:
        state = torch.load(path, weights_only=False, map_location="cpu")
    except Exception as exc:
        raise CheckpointMismatchError(f"{str(path)!r} is not a marlkit checkpoint ({exc})") from None
    if not isinstance(state, dict) or "groups" not in state:
        raise CheckpointMismatchError(f"{str(path)!r} is not a marlkit run checkpoint")
    return state


def read_steps(path: str | Path) -> int:
    """Env steps done when the checkpoint was written."""
    state = _read(Path(path))
    if "steps" in state:
        return int(state["steps"])
    import pickle
    return int(pickle.loads(state["runner"])["steps"])


def load_checkpoint(path: str | Path, env_name: str, groups: dict[str, str]) -> dict:
    """Load and check that the checkpoint fits this run (same env, same agent per group)."""
    path = Path(path)
    state = _read(path)
    if state.get("env_name") != env_name:
        theirs = state.get("env_name")
        raise CheckpointMismatchError(f"{str(path)!r} was trained on env {theirs!r}, but this run uses env "
                                      f"{env_name!r}; pass --env {theirs} (or the YAML file it was trained "
                                      "with: see config.yaml beside the checkpoint)")
    theirs = {g: s.get("agent") for g, s in state["groups"].items()}
    missing = sorted(set(groups) - set(theirs))
    if missing:
        raise CheckpointMismatchError(f"{str(path)!r} has no weights for group(s) {missing}; it holds {sorted(theirs)}")
    for g, agent in groups.items():
        if theirs[g] != agent:
            raise CheckpointMismatchError(f"{str(path)!r}: group {g!r} was trained by agent {theirs[g]!r}, "
                                          f"but this run uses {agent!r} (pass --agent {theirs[g]})")
    return state

"""Run checkpoints (``latest.pt``, ``best.pt``): every group's agent, the training state, the envs
where they can be saved, and the random generators; written whole or not at all, read back with
everything checked against the run that loads them."""
from __future__ import annotations

import os
import pickle
import random
import tempfile
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from marlkit.agents.base import CHECKPOINT_VERSION, Agent
from marlkit.config import RunConfig
from marlkit.errors import CheckpointMismatchError
from marlkit.runners.train_state import TrainState


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


def load_checkpoint(path: str | Path, env_name: str, groups: dict[str, str] | None = None) -> dict:
    """Load and check that the checkpoint fits this run: the same env and, for ``groups`` (group
    -> agent name), the same agent per group (``check_groups_fit``)."""
    path = Path(path)
    state = _read(path)
    if state.get("env_name") != env_name:
        theirs = state.get("env_name")
        raise CheckpointMismatchError(f"{str(path)!r} was trained on env {theirs!r}, but this run uses env "
                                      f"{env_name!r}; pass --env {theirs} (or the YAML file it was trained "
                                      "with: see config.yaml beside the checkpoint)")
    if groups:
        check_groups_fit(state, path, groups)
    return state


def check_groups_fit(state: dict, path: str | Path, groups: dict[str, str]) -> None:
    """Refuse a checkpoint (read from ``path``) without weights for one of ``groups`` (group ->
    agent name) or trained by another agent there."""
    theirs = {g: s.get("agent") for g, s in state["groups"].items()}
    missing = sorted(set(groups) - set(theirs))
    if missing:
        raise CheckpointMismatchError(f"{str(path)!r} has no weights for group(s) {missing}; it holds {sorted(theirs)}")
    for g, agent in groups.items():
        if theirs[g] != agent:
            raise CheckpointMismatchError(f"{str(path)!r}: group {g!r} was trained by agent {theirs[g]!r}, "
                                          f"but this run uses {agent!r} (pass --agent {theirs[g]})")


def load_group(agent: Agent, state: dict, name: str, weights_only: bool) -> None:
    """Load one group's checkpoint; a network that does not fit the agent's settings is a clear
    error, not a tensor-shape traceback."""
    try:
        agent.load_state_dict(state, weights_only=weights_only)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise CheckpointMismatchError(f"the checkpoint of group {agent.group.name!r} does not fit the settings in "
                                      f"agents.{name} ({first}); use the network settings it was trained with "
                                      "(config.yaml beside the checkpoint)") from None


def save_run_checkpoint(path: Path, cfg: RunConfig, agents: dict[str, Agent], state: TrainState,
                        venv_state: bytes | None, resumable: bool = True) -> None:
    """The run at a rollout boundary; ``venv_state`` (the vector env's ``state_dict``) None where the
    envs cannot be saved (a resume then starts fresh episodes); ``resumable`` False (best.pt, never
    resumed from) leaves out the rollout in flight and the storages' contents."""
    runner_state = {**state.state_dict(resumable), "venv": venv_state is not None}
    save_checkpoint(path, {
        "env_name": cfg.env_name, "agent": cfg.agent, "config": cfg.to_dict(),
        "steps": state.steps, "groups": {g: a.state_dict() for g, a in agents.items()},
        "runner": pickle.dumps(runner_state), "venv": venv_state,
        "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}})


def restore_run_checkpoint(path: Path, cfg: RunConfig, agents: dict[str, Agent], names: dict[str, str],
                           venv) -> TrainState:
    """A run's ``latest.pt`` back into its ``agents`` (``names``: group -> agent name), envs and
    generators -> the training state to go on from."""
    ckpt = load_checkpoint(path, cfg.env_name, names)
    for g, agent in agents.items():
        load_group(agent, ckpt["groups"][g], names[g], weights_only=False)
    saved = pickle.loads(ckpt["runner"])
    with_envs = saved.pop("venv")
    state = TrainState.from_state_dict(saved)
    if not with_envs or not venv.load_state_dict(ckpt["venv"]):
        # a rollout saved beside the last update keeps the observation it ended at, to value its tail
        state.obs = venv.reset(seed=cfg.seed * 10_000 + state.steps)
        state.hidden = {g: a.initial_hidden(venv.num_envs) for g, a in agents.items()}
        why = ("the envs' saved state was written by another version of marlkit or of the env's library and "
               "does not fit this one" if with_envs else
               "this env is not known to come back exactly from a checkpoint (env.exact_resume is false)")
        tqdm.write(f"resume: {why}, so it starts fresh episodes; agents, optimisers and counters continue "
                   "exactly, the env trajectory does not")
    rng = ckpt["rng"]
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    return state

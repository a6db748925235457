"""Setting a run up: this process (threads, seeds), the checks that need no env, and the parts a
run is made of: its vector env and one agent per group, with who drives each group settled once."""
from __future__ import annotations

import random
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from marlkit.agents.base import Agent
from marlkit.allocator import keep_freed_memory
from marlkit.config import RunConfig
from marlkit.envs.factory import make_env_vector
from marlkit.errors import ConfigError
from marlkit.registry import get_agent
from marlkit.runners.checkpoint import load_checkpoint
from marlkit.runners.group_agents import build_agents, check_best_metric, check_groups, group_agent_names
from marlkit.runners.teams import settle_teams


@dataclass
class RunParts:
    venv: object                  # the vector env (EpisodeStatistics around a backend)
    agents: dict[str, Agent]      # group -> its agent
    agent_names: dict[str, str]   # group -> the registered agent that drives it
    learning_groups: list[str]    # the groups whose agent learns and is trained
    teams: dict[str, list[str]]   # team -> its groups (runners/teams.py)


def prepare(cfg: RunConfig) -> dict | None:
    """This process set up for the run (freed memory kept, torch threads, every generator seeded)
    and what can be refused before an env starts refused -> the ``--load`` checkpoint, read once
    (None without one, and on resume: a resumed run takes every group's weights from its latest.pt)."""
    keep_freed_memory()
    if cfg.runner.torch_threads:
        torch.set_num_threads(cfg.runner.torch_threads)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    try:
        device = torch.device(cfg.device)
    except RuntimeError:
        raise ConfigError(f"device: {cfg.device!r} is not a torch device; use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device: {cfg.device!r} was asked for but CUDA is not available; use --device cpu")
    named = {cfg.agent, *(g.agent for g in cfg.groups.values() if g.agent)}
    if cfg.mode == "test" and not cfg.load and any(get_agent(name).learns for name in named):
        raise ConfigError("--test needs a checkpoint: pass --load runs/<env>/<agent>/<run>/best.pt "
                          "(or --agent random, which needs none)")
    if not cfg.load or cfg.resume:
        return None
    if not Path(cfg.load).is_file():
        raise FileNotFoundError(f"--load {cfg.load!r}: no such checkpoint file")
    return load_checkpoint(cfg.load, cfg.env_name)


def make_venv(cfg: RunConfig, num_envs: int | None = None, render: bool = False, vectorize: str | None = None,
              first_index: int = 0):
    """``num_envs`` envs of the run's env (``runner.parallels``: None), vectorised as the run says
    or as ``vectorize``; ``first_index``: the first env's index, so that two vector envs open at
    once hand out distinct ports and worker ids."""
    rc = cfg.runner if vectorize is None else replace(cfg.runner, vectorize=vectorize)
    return make_env_vector(cfg.env, rc, num_envs, render, first_index)


def build_parts(cfg: RunConfig, loaded: dict | None, num_envs: int | None = None, render: bool = False,
                vectorize: str | None = None) -> RunParts:
    """The vector env and one agent per group (weights from ``loaded``, ``prepare``'s checkpoint)."""
    check_groups(cfg)
    venv = make_venv(cfg, num_envs, render, vectorize)
    try:
        names = group_agent_names(cfg, venv.spec.groups)
        teams = settle_teams(cfg, venv)
        check_best_metric(cfg.runner.best_metric, venv.spec.groups, teams)
        agents = build_agents(cfg, replace(venv.spec, teams=teams), venv.num_envs, names, loaded)
    except BaseException:
        venv.close()
        raise
    learning = [g for g, agent in agents.items() if agent.learns and (g not in cfg.groups or cfg.groups[g].train)]
    return RunParts(venv, agents, names, learning, teams)

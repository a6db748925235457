"""Which agent drives which group, each built from the config, its memory checked, its weights loaded."""
from __future__ import annotations

from marlkit.agents.base import Agent
from marlkit.config import RunConfig
from marlkit.errors import ConfigError
from marlkit.memory import check_fits
from marlkit.registry import closest, get_agent, get_env_type
from marlkit.runners.checkpoint import check_groups_fit, load_checkpoint, load_group
from marlkit.storage import StorageLayout


def group_agent_names(cfg: RunConfig, groups) -> dict[str, str]:
    """Which registered agent drives each of the env's ``groups``: the group's own ``agent`` or the
    run's; unknown group names and a ``best_metric`` that is no group are refused."""
    unknown = [g for g in cfg.groups if g not in groups]
    if unknown:
        raise ConfigError(f"groups: unknown group {unknown[0]!r}{closest(unknown[0], groups)}; this env's "
                          f"groups are {', '.join(groups)}")
    best = cfg.runner.best_metric
    if best is not None and best not in groups:
        raise ConfigError(f"runner.best_metric: {best!r} is not a group of this env{closest(best, groups)}; "
                          f"choose one of {', '.join(groups)}, or null for the mean over the learning groups")
    return {g: (cfg.groups[g].agent if g in cfg.groups and cfg.groups[g].agent
                else cfg.agent) for g in groups}

def check_groups(cfg: RunConfig) -> None:
    """Agents that refuse some groups (their spaces) do so before the envs start, where the env
    type can tell its spec without them."""
    names = {cfg.agent, *(g.agent for g in cfg.groups.values() if g.agent)}
    if not any(get_agent(name).checks_groups for name in names):
        return
    spec = get_env_type(cfg.env.type).probe_spec(cfg.env)
    if spec is not None:
        for g, name in group_agent_names(cfg, spec.groups).items():
            get_agent(name).check_group(spec.groups[g])

def build_agents(cfg: RunConfig, spec, num_envs: int, names: dict[str, str], loaded: dict | None) -> dict[str, Agent]:
    """One agent per group, ``names[g]`` the agent of group ``g`` (``group_agent_names``); weights
    from ``loaded`` (the ``--load`` checkpoint, read already: every group) or a group's own
    ``load``, except on resume: the run's latest.pt holds every group's weights, and the files it
    began from may have moved since."""
    rc = cfg.runner
    estimates = {g: get_agent(names[g]).memory_estimate(StorageLayout(gs, spec, num_envs, rc.horizon,
                                                                      double=rc.overlapped()),
                                                        cfg.agents[names[g]], key=f"agents.{names[g]}")
                 for g, gs in spec.groups.items()}
    check_fits(estimates)
    loads = not cfg.resume
    if loaded is not None:
        check_groups_fit(loaded, cfg.load, names)
    agents = {}
    for i, (g, gs) in enumerate(spec.groups.items()):
        agents[g] = get_agent(names[g])(gs, spec, cfg.agents[names[g]], seed=cfg.seed * 1000 + i,
                                        device=cfg.device)
        group_cfg = cfg.groups.get(g)
        ckpt = load_checkpoint(group_cfg.load, cfg.env_name, {g: names[g]}) \
            if loads and group_cfg is not None and group_cfg.load else loaded
        if ckpt is not None:
            load_group(agents[g], ckpt["groups"][g], names[g], weights_only=True)
    return agents

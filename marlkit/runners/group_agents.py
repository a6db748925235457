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
    run's; unknown group names and a ``best_metric`` that is no group or team are refused."""
    unknown = [g for g in cfg.groups if g not in groups]
    if unknown:
        raise ConfigError(f"groups: unknown group {unknown[0]!r}{closest(unknown[0], groups)}; this env's "
                          f"groups are {', '.join(groups)}")
    check_best_metric(cfg.runner.best_metric, groups, cfg.env.teams or {})
    return {g: (cfg.groups[g].agent if g in cfg.groups and cfg.groups[g].agent
                else cfg.agent) for g in groups}

def check_best_metric(best: str | None, groups, teams) -> None:
    """``runner.best_metric`` names one of ``groups`` or ``teams``, or is None."""
    names = [*groups, *(t for t in teams if t not in groups)]
    if best is not None and best not in names:
        raise ConfigError(f"runner.best_metric: {best!r} is not a group or team of this env{closest(best, names)}; "
                          f"choose one of {', '.join(names)}, or null for the mean over the learning teams")


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
    """One agent per group, ``names[g]`` the agent of group ``g`` (``group_agent_names``); the
    groups of a team (``spec.teams``) whose agents are of one class and learn join as one
    (``Agent.join_team``); then weights from ``loaded`` (the ``--load`` checkpoint, read already:
    every group) or a group's own ``load``, except on resume: the run's latest.pt holds every
    group's weights, and the files it began from may have moved since."""
    rc = cfg.runner
    estimates = {g: get_agent(names[g]).memory_estimate(StorageLayout(gs, spec, num_envs, rc.horizon,
                                                                      double=rc.overlapped()),
                                                        cfg.agents[names[g]], key=f"agents.{names[g]}")
                 for g, gs in spec.groups.items()}
    check_fits(estimates)
    if loaded is not None:
        check_groups_fit(loaded, cfg.load, names)
    agents = {g: get_agent(names[g])(gs, spec, cfg.agents[names[g]], seed=cfg.seed * 1000 + i, device=cfg.device)
              for i, (g, gs) in enumerate(spec.groups.items())}
    for members in (spec.teams or {}).values():
        learning = [g for g in members if agents[g].learns and (g not in cfg.groups or cfg.groups[g].train)]
        if len(learning) > 1 and len({names[g] for g in learning}) == 1:
            type(agents[learning[0]]).join_team({g: agents[g] for g in learning})
    for g, agent in agents.items():
        group_cfg = cfg.groups.get(g)
        own = group_cfg is not None and group_cfg.load and not cfg.resume
        ckpt = load_checkpoint(group_cfg.load, cfg.env_name, {g: names[g]}) if own else \
            None if cfg.resume else loaded
        if ckpt is not None:
            load_group(agent, ckpt["groups"][g], names[g], weights_only=True)
    return agents

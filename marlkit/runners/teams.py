"""Teams: the groups that share a reward. A group shares spaces and a network; a team shares a
reward, and is scored, evaluated and (for the agents that learn a team's value) mixed as one.

Where the teams come from, first that applies: ``env.teams``; what the env type declares
(``EnvSpec.teams``: a Unity scene's team ids); one group alone; else the random policy plays
``PROBE_STEPS`` steps of every env, and groups whose rewards were equal at every one of them (the
mean over each group's acting agents) are one team. Where no reward but 0 came, nothing can be
told apart, and every group is a team of its own. The run says once what it found, and keeps it
in its config (``env.teams``), so that a resumed or tested run does not look again.
"""
from __future__ import annotations

import sys

import numpy as np

from marlkit.errors import ConfigError
from marlkit.registry import closest
from marlkit.runners.collector import act
from marlkit.runners.evaluation import random_policy

PROBE_STEPS = 100   # steps of every env the random policy plays to tell teams apart


def check_teams(teams: dict[str, list[str]], groups) -> dict[str, list[str]]:
    """``env.teams`` against the env's ``groups`` -> every group's team, the groups left out a team
    of their own each, members in the env's group order; an unknown group, or one in two teams,
    is refused naming it."""
    seen: dict[str, str] = {}
    for team, members in teams.items():
        if not members:
            raise ConfigError(f"env.teams.{team}: a team needs at least one group; this env's groups are "
                              f"{', '.join(groups)}")
        for g in members:
            if g not in groups:
                raise ConfigError(f"env.teams.{team}: unknown group {g!r}{closest(g, groups)}; this env's groups "
                                  f"are {', '.join(groups)}")
            if g in seen:
                raise ConfigError(f"env.teams: group {g!r} is in two teams, {seen[g]!r} and {team!r}; a group "
                                  "plays in one team")
            seen[g] = team
    out = {team: [g for g in groups if seen.get(g) == team] for team in teams}
    clash = [g for g in groups if g not in seen and g in out]
    if clash:
        raise ConfigError(f"env.teams: team {clash[0]!r} has the name of a group it does not hold; a group left "
                          "out of env.teams is a team of its own, under its own name")
    return {**out, **{g: [g] for g in groups if g not in seen}}


def probe_teams(venv, seed: int, steps: int = PROBE_STEPS) -> dict[str, list[str]] | None:
    """Play ``steps`` steps of every env of ``venv`` with the random policy -> the teams of groups
    whose rewards were equal at every step (per env, the mean over each group's acting agents;
    steps where a group had no acting agent are not compared), or None where every reward was 0."""
    groups = list(venv.spec.groups)
    policy = random_policy(venv.spec)
    obs = venv.reset(seed=seed)
    hidden = {g: None for g in groups}
    apart = np.zeros((len(groups), len(groups)), bool)   # a step told the two apart
    paid = False
    for _ in range(steps):
        outs = act(policy, obs, hidden, explore=True)
        result = venv.step({g: out.actions for g, out in outs.items()})
        means = []
        for g in groups:
            acting = obs.agent_mask[g]
            total = np.where(acting, result.reward[g], 0.0).sum(-1)
            count = acting.sum(-1)
            means.append(np.where(count > 0, total / np.maximum(count, 1), np.nan))
            paid |= bool(np.any(result.reward[g] != 0))
        means = np.array(means)                                   # [G, E]
        both = ~np.isnan(means[:, None]) & ~np.isnan(means[None])  # [G, G, E]
        differ = ~np.isclose(means[:, None], means[None], rtol=1e-5, atol=1e-6)
        apart |= (both & differ).any(-1)
        obs = result.next
    if not paid:
        return None
    teams: list[list[str]] = []
    for i, g in enumerate(groups):   # equal rewards are an equivalence: each group joins the first it equals
        team = next((t for t in teams if not apart[i, groups.index(t[0])]), None)
        if team is None:
            teams.append([g])
        else:
            team.append(g)
    return {"+".join(t) if len(t) > 1 else t[0]: t for t in teams}


def settle_teams(cfg, venv) -> dict[str, list[str]]:
    """The run's teams (see the module's docstring), written into ``cfg.env.teams`` where they were
    looked for; one line on stderr says what was found."""
    groups = list(venv.spec.groups)
    if cfg.env.teams is not None:
        return check_teams(cfg.env.teams, groups)
    if venv.spec.teams is not None:
        return check_teams(venv.spec.teams, groups)
    if len(groups) == 1:
        return {groups[0]: groups}
    found = probe_teams(venv, cfg.seed * 10_000 - 1)
    if found is None:
        teams = {g: [g] for g in groups}
        print(f"marlkit: teams: every reward of the random policy's first {PROBE_STEPS} steps was 0, so groups "
              f"{', '.join(groups)} are a team each; set env.teams where some share a reward", file=sys.stderr)
    else:
        teams = found
        shown = "; ".join(f"{t}: {', '.join(m)}" for t, m in teams.items())
        print(f"marlkit: teams, from the random policy's rewards over {PROBE_STEPS} steps of every env: {shown} "
              "(env.teams sets them)", file=sys.stderr)
    cfg.env.teams = teams
    return teams

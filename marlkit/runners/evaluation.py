"""Playing whole episodes (evaluation, ``--test``, the random baseline) and summing them up."""
from __future__ import annotations

from contextlib import ExitStack

import numpy as np

from marlkit.agents.base import Agent
from marlkit.config import RunnerConfig
from marlkit.errors import EnvAPIError
from marlkit.registry import get_agent
from marlkit.runners.collector import act, advance_hidden
from marlkit.runners.statistics import Z95, mean_ci


class EvaluationStopped(Exception):
    """A stop request arrived while episodes were being played."""


def mean_stats(episodes) -> dict[str, float]:
    """Per name, the mean of the episodes' ``episode_stats()`` values (episodes that lack a name are
    left out of its mean)."""
    names = dict.fromkeys(k for ep in episodes for k in ep)
    return {k: float(np.mean([ep[k] for ep in episodes if k in ep])) for k in names}


def run_episodes(venv, agents: dict[str, Agent], n_episodes: int, explore: bool, seed: int, step_limit: int,
                 on_frame=None, stop=None) -> list[dict]:
    """Play exactly ``n_episodes`` with ``agents`` (split evenly over the envs, so short episodes
    are not over-sampled) and return each one's per-group ``return``, ``length`` and ``stats``.
    ``on_frame(k)`` is called after every step with the number of episodes env 0 has finished; a
    truthy ``stop`` (a stop request) aborts. An env that plays ``step_limit`` steps per episode it
    owes without finishing them is an error (``runner.episode_step_limit``)."""
    quota = np.full(venv.num_envs, n_episodes // venv.num_envs)
    quota[: n_episodes % venv.num_envs] += 1
    done = np.zeros(venv.num_envs, int)
    results: list[dict] = []
    obs = venv.reset(seed=seed)
    if on_frame is not None:
        on_frame(0)
    hidden = {g: a.initial_hidden(venv.num_envs) for g, a in agents.items()}
    limit = step_limit * int(quota.max())
    for _ in range(limit):
        if (done >= quota).all():
            break
        if stop:
            raise EvaluationStopped()
        outs = act(agents, obs, hidden, explore)
        res = venv.step({g: out.actions for g, out in outs.items()})
        for e, info in enumerate(res.infos):
            if "episode" in info and done[e] < quota[e]:
                done[e] += 1
                results.append({"return": info["episode"]["return"], "length": info["episode"]["length"],
                                "stats": info["episode"].get("stats", {}),
                                "final_reward": info["episode"].get("final_reward", {})})
        if on_frame is not None:
            on_frame(int(done[0]))
        hidden = advance_hidden(outs, res.episode_end, res.agent_end)
        obs = res.next
    else:
        raise EnvAPIError(f"{int(done.sum())} of {n_episodes} episodes ended within {limit} steps per env; "
                          "an episode that never ends needs env.max_episode_steps (or raise "
                          "runner.episode_step_limit)")
    return results


def random_policy(spec) -> dict[str, Agent]:
    """The random policy for every group of ``spec``: the baseline of ``--benchmark``."""
    cls = get_agent("random")
    return {g: cls(gs, spec, cls.config_cls()) for g, gs in spec.groups.items()}


def best_metric_description(best_metric: str | None, groups, learning_teams: list[str]) -> str:
    """In words, what best.pt is chosen on (``runner.best_metric``: a group of ``groups``, a team, or
    None)."""
    against = " against the random policy playing the other teams" if len(learning_teams) > 1 else ""
    what = ("mean return of the learning teams" if best_metric is None else
            f"return of group {best_metric!r}" if best_metric in groups else f"return of team {best_metric!r}")
    return what + against


def team_return(episode: dict, members: list[str]) -> float | None:
    """A team's return in one episode: the mean of its groups' returns (each the mean over its
    agents; the groups of a team share a reward, so they agree); None where none of them played."""
    played = [episode["return"][g] for g in members if g in episode["return"]]
    return float(np.mean(played)) if played else None


class Evaluator:
    """The evaluation protocol of a run (``rc``: its runner settings): ``runner.eval_episodes``
    episodes on the evaluation envs, from the same env seed every time (from the run's ``seed``),
    each agent drawing from generators of its own (so training draws the same numbers whether and
    however often it is evaluated). ``teams`` (team -> its groups) says who plays with whom,
    ``learning_groups`` who learns; a team with a learning group learns.

    A team's return is what best.pt is chosen on. Where two teams or more learn (rivals), their
    returns against each other say little of progress (in a zero-sum game they sum to about 0
    whatever happens), so each learning team is also evaluated against the random policy playing
    every other team, never its own teammates (``vs_random``), and best.pt is chosen on those
    returns against that fixed opponent."""

    def __init__(self, rc: RunnerConfig, seed: int, teams: dict[str, list[str]], learning_groups: list[str]):
        self.rc, self.seed, self.teams = rc, seed, teams
        self.learning_teams = [t for t, members in teams.items() if any(g in learning_groups for g in members)]

    def scored_teams(self) -> list[str]:
        """The teams whose returns make the score (``runner.best_metric``: a team, or a group's
        team; else the learning teams, else every team)."""
        best = self.rc.best_metric
        if best is not None:
            return [best if best in self.teams else next(t for t, m in self.teams.items() if best in m)]
        return self.learning_teams or list(self.teams)

    def play(self, eval_venv, agents: dict[str, Agent], stop) -> list[dict]:
        rc, seed = self.rc, self.seed * 10_000 + 777
        with ExitStack() as own:
            for i, agent in enumerate(agents.values()):
                own.enter_context(agent.own_generators(seed * 1000 + i))
            return run_episodes(eval_venv, agents, rc.eval_episodes, explore=not rc.eval_deterministic, seed=seed,
                                step_limit=rc.episode_step_limit, stop=stop)

    def row(self, eval_venv, agents: dict[str, Agent], stop=None, opponents: dict[str, Agent] | None = None) -> dict:
        """-> per group the mean, std and 95% confidence interval (``ci``: the half-width) of its
        return over the episodes ``agents`` play; per team (``teams``) the mean, ``ci`` and ``se`` of
        its return; the env's episode statistics (``env``, with ``env_ci``); the number of
        ``episodes``; with ``opponents`` (the random policy of every group) and two learning teams
        or more, ``vs_random``: each learning team's return against ``opponents`` playing the other
        teams; and the ``score`` best.pt is chosen on, with ``score_ci`` and ``score_se``: the scored
        teams' mean return (against the opponents where there are)."""
        episodes = self.play(eval_venv, agents, stop)
        row = {"mean": {}, "std": {}, "ci": {}, "episodes": len(episodes)}
        for g in agents:
            values = np.array([ep["return"][g] for ep in episodes if g in ep["return"]])
            row["mean"][g], row["ci"][g], _ = mean_ci(values)
            row["std"][g] = float(values.std())
        row["teams"] = {t: _summary([team_return(ep, members) for ep in episodes]) for t, members in self.teams.items()}
        stats = [ep["stats"] for ep in episodes]
        names = dict.fromkeys(k for ep in stats for k in ep)
        if names:
            row["env"], row["env_ci"] = {}, {}
            for k in names:
                row["env"][k], row["env_ci"][k], _ = mean_ci([ep[k] for ep in stats if k in ep])
        scored = self.scored_teams()
        if opponents is not None and len(self.learning_teams) > 1:
            row["vs_random"] = {}
            for t in self.learning_teams:
                mixed = {g: agents[g] if g in self.teams[t] else opponents[g] for g in agents}
                row["vs_random"][t] = _summary([team_return(ep, self.teams[t]) for ep in self.play(eval_venv, mixed,
                                                                                                    stop)])
            parts = [row["vs_random"][t] for t in scored]
            row["score"] = float(np.mean([p["mean"] for p in parts]))
            row["score_se"] = float(np.sqrt(sum(p["se"] ** 2 for p in parts))) / len(parts)
            row["score_ci"] = Z95 * row["score_se"]
        else:
            per_episode = [np.mean(played) for ep in episodes
                           if (played := [r for t in scored if (r := team_return(ep, self.teams[t])) is not None])]
            row["score"], row["score_ci"], row["score_se"] = mean_ci(per_episode)
        return row


def _summary(returns: list) -> dict:
    """``mean``, ``ci`` (95% half-width) and ``se`` of the returns that are not None."""
    mean, ci, se = mean_ci([r for r in returns if r is not None])
    return {"mean": mean, "ci": ci, "se": se}


def evaluation_line(row: dict, baseline: dict | None, new_best: bool) -> str:
    """One console line per evaluation: the step, each group's mean return with its 95% interval
    (the random policy's beside it), the env's statistics, and whether it is the new best."""
    parts = []
    for g, mean in row["mean"].items():
        random = f" (random {baseline['mean'][g]:.3f})" if baseline and g in baseline["mean"] else ""
        parts.append(f"{g} {mean:.3f} ± {row['ci'][g]:.3f}{random}")
    parts += [f"team {t} {v['mean']:.3f} ± {v['ci']:.3f}" for t, v in row.get("teams", {}).items() if t not in row["mean"]]
    parts += [f"{k} {v:.3f} ± {row['env_ci'][k]:.3f}" for k, v in row.get("env", {}).items()]
    parts += [f"{t} vs random {v['mean']:.3f} ± {v['ci']:.3f}" for t, v in row.get("vs_random", {}).items()]
    best = ", new best (best.pt)" if new_best else ""
    return f"eval at step {row['step']:,} over {row['episodes']} episodes: {'; '.join(parts)}{best}"

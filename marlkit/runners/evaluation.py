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
                                "stats": info["episode"].get("stats", {})})
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


def best_metric_description(best_metric: str | None, learning_groups: list[str]) -> str:
    """In words, what best.pt is chosen on (``runner.best_metric``)."""
    against = " against the random policy playing the other groups" if len(learning_groups) > 1 else ""
    return (f"return of group {best_metric!r}" if best_metric else "mean return of the learning groups") + against


class Evaluator:
    """The evaluation protocol of a run (``rc``: its runner settings): ``runner.eval_episodes``
    episodes on the evaluation envs, from the same env seed every time (from the run's ``seed``),
    each agent drawing from generators of its own (so training draws the same numbers whether and
    however often it is evaluated); ``learning_groups`` names the groups that learn.

    Where two groups or more learn (teams that play each other), their returns against each other
    say little of progress (in a zero-sum game they sum to about 0 whatever happens), so each
    learning group is also evaluated against the random policy playing every other group
    (``vs_random``), and best.pt is chosen on those returns against that fixed opponent."""

    def __init__(self, rc: RunnerConfig, seed: int, learning_groups: list[str]):
        self.rc, self.seed, self.learning_groups = rc, seed, learning_groups

    def scored_groups(self, groups) -> list[str]:
        """The groups whose returns make the score best.pt is chosen on (``runner.best_metric``)."""
        if self.rc.best_metric is not None:
            return [self.rc.best_metric]
        return [g for g in self.learning_groups if g in groups] or list(groups)

    def _play(self, eval_venv, agents: dict[str, Agent], stop) -> list[dict]:
        rc, seed = self.rc, self.seed * 10_000 + 777
        with ExitStack() as own:
            for i, agent in enumerate(agents.values()):
                own.enter_context(agent.own_generators(seed * 1000 + i))
            return run_episodes(eval_venv, agents, rc.eval_episodes, explore=not rc.eval_deterministic, seed=seed,
                                step_limit=rc.episode_step_limit, stop=stop)

    def row(self, eval_venv, agents: dict[str, Agent], stop=None, opponents: dict[str, Agent] | None = None) -> dict:
        """-> per group the mean, std and 95% confidence interval (``ci``: the half-width) of its
        return over the episodes ``agents`` play; the env's episode statistics (``env``, with
        ``env_ci``); the number of ``episodes``; with ``opponents`` (the random policy of every
        group) and two learning groups or more, ``vs_random``: each learning group's return against
        ``opponents`` playing the others; and the ``score`` best.pt is chosen on, with ``score_ci``
        and ``score_se``: the scored groups' mean return (against the opponents where there are)."""
        episodes = self._play(eval_venv, agents, stop)
        row = {"mean": {}, "std": {}, "ci": {}, "episodes": len(episodes)}
        for g in agents:
            values = np.array([ep["return"][g] for ep in episodes if g in ep["return"]])
            row["mean"][g], row["ci"][g], _ = mean_ci(values)
            row["std"][g] = float(values.std())
        stats = [ep["stats"] for ep in episodes]
        names = dict.fromkeys(k for ep in stats for k in ep)
        if names:
            row["env"], row["env_ci"] = {}, {}
            for k in names:
                row["env"][k], row["env_ci"][k], _ = mean_ci([ep[k] for ep in stats if k in ep])
        scored = self.scored_groups(agents)
        if opponents is not None and len(self.learning_groups) > 1:
            row["vs_random"] = {}
            for g in self.learning_groups:
                mixed = {h: agents[h] if h == g else opponents[h] for h in agents}
                played = [ep["return"][g] for ep in self._play(eval_venv, mixed, stop) if g in ep["return"]]
                mean, ci, se = mean_ci(played)
                row["vs_random"][g] = {"mean": mean, "ci": ci, "se": se}
            parts = [row["vs_random"][g] for g in scored]
            row["score"] = float(np.mean([p["mean"] for p in parts]))
            row["score_se"] = float(np.sqrt(sum(p["se"] ** 2 for p in parts))) / len(parts)
            row["score_ci"] = Z95 * row["score_se"]
        else:
            per_episode = [np.mean([ep["return"][g] for g in scored if g in ep["return"]]) for ep in episodes
                           if any(g in ep["return"] for g in scored)]
            row["score"], row["score_ci"], row["score_se"] = mean_ci(per_episode)
        return row


def evaluation_line(row: dict, baseline: dict | None, new_best: bool) -> str:
    """One console line per evaluation: the step, each group's mean return with its 95% interval
    (the random policy's beside it), the env's statistics, and whether it is the new best."""
    parts = []
    for g, mean in row["mean"].items():
        random = f" (random {baseline['mean'][g]:.3f})" if baseline and g in baseline["mean"] else ""
        parts.append(f"{g} {mean:.3f} ± {row['ci'][g]:.3f}{random}")
    parts += [f"{k} {v:.3f} ± {row['env_ci'][k]:.3f}" for k, v in row.get("env", {}).items()]
    parts += [f"{g} vs random {v['mean']:.3f} ± {v['ci']:.3f}" for g, v in row.get("vs_random", {}).items()]
    best = ", new best (best.pt)" if new_best else ""
    return f"eval at step {row['step']:,} over {row['episodes']} episodes: {'; '.join(parts)}{best}"

"""Evaluation of a self-play run against fixed opponents (``self_play.opponents``): the learner in
each seat against each opponent, as win, draw and loss rates with 95% intervals. best.pt is chosen
on the mean win rate over them, never on the Elo, which rises against the learner's own past and
says nothing of strength against anyone else."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from marlkit.agents.base import CHECKPOINT_VERSION, Agent, check_compatible
from marlkit.config import build
from marlkit.errors import ConfigError
from marlkit.registry import get_agent
from marlkit.runners.checkpoint import load_checkpoint
from marlkit.runners.elo import DRAW, LOSS, WIN, match_result, rate_interval
from marlkit.runners.evaluation import Evaluator, team_return
from marlkit.runners.self_play import SelfPlay
from marlkit.runners.statistics import Z95, mean_ci


def build_opponents(names: list[str], spec, env_name: str) -> dict[str, dict[str, Agent]]:
    """Per name of ``self_play.opponents``, an agent for every group of ``spec``: ``random``, another
    registered agent that does not learn (a scripted opponent), or the path of a run checkpoint
    (``best.pt``, ``latest.pt``) or of a self-play snapshot (``pool/<pool>_step<N>.pt``): a frozen
    reference, each group with its own weights."""
    out = {}
    for name in names:
        if name.endswith(".pt") or Path(name).is_file():
            out[name] = _reference(name, spec, env_name)
            continue
        try:
            cls = get_agent(name)
        except KeyError as exc:
            raise ConfigError(f"self_play.opponents: {exc}") from None
        if cls.learns:
            raise ConfigError(f"self_play.opponents: {name} learns, and an opponent of the evaluation is fixed; name a "
                              "checkpoint of it (runs/.../best.pt), random, or a scripted opponent")
        out[name] = {g: cls(gs, spec, cls.config_cls()) for g, gs in spec.groups.items()}
    return out


def _reference(path: str, spec, env_name: str) -> dict[str, Agent]:
    if not Path(path).is_file():
        raise ConfigError(f"self_play.opponents: {path!r} is neither a checkpoint file nor a registered agent")
    ckpt = load_checkpoint(path, env_name)
    agents = {}
    for g, gs in spec.groups.items():
        if g not in ckpt["groups"]:
            raise ConfigError(f"self_play.opponents: {path!r} has no weights for group {g!r}")
        state = ckpt["groups"][g]
        cls = get_agent(state["agent"])
        agent = cls(gs, spec, build(cls.config_cls, state["config"], f"agents.{state['agent']}"))
        if "policy" in state:   # a snapshot of a self-play pool (runs/.../pool/<pool>_step<N>.pt)
            check_compatible({**state, "version": CHECKPOINT_VERSION}, state["agent"], gs)
            agent.load_policy_state_dict(state["policy"])
        else:
            agent.load_state_dict(state, weights_only=True)
        agents[g] = agent
    return agents


def match_row(evaluator: Evaluator, eval_venv, self_play: SelfPlay, opponents: dict[str, dict[str, Agent]],
              stop=None) -> dict:
    """The learner's current policy in each seat (team) against each fixed opponent, over
    ``runner.eval_episodes`` each -> ``matches`` (``<opponent> as <team>``: win, draw and loss
    rates, the win rate's Wilson interval, the learner's mean return), per group and team the
    learner's return over all its matches (``mean``, ``ci``, ``teams``), the env's statistics over
    them (``env``, ``env_ci``), and the ``score`` best.pt
    is chosen on: the mean win rate over the matches, with ``score_se`` and ``score_ci``."""
    matches, returns, team_returns, stats = {}, {}, {}, []
    for name, fixed in opponents.items():
        for seat in self_play.names:
            mine = self_play.teams[seat]
            theirs = [g for g in fixed if g not in mine]
            players = {**self_play.seat_policies(seat), **{g: fixed[g] for g in theirs}}
            episodes = evaluator.play(eval_venv, {g: players[g] for g in fixed}, stop)
            results = [r for ep in episodes
                       if (r := match_result(ep, mine, theirs, self_play.agents_of, self_play.cfg.outcome)) is not None]
            n, wins = max(len(results), 1), results.count(WIN)
            lo, hi = rate_interval(wins, n)
            seat_returns = [r for ep in episodes if (r := team_return(ep, mine)) is not None]
            matches[f"{name} as {seat}"] = {
                "opponent": name, "seat": seat, "episodes": n, "win": wins / n, "draw": results.count(DRAW) / n,
                "loss": results.count(LOSS) / n, "win_low": lo, "win_high": hi,
                "return": float(np.mean(seat_returns)) if seat_returns else float("nan")}
            for g in mine:
                returns.setdefault(g, []).extend(ep["return"][g] for ep in episodes if g in ep["return"])
            team_returns.setdefault(seat, []).extend(seat_returns)
            stats += [ep["stats"] for ep in episodes]
    row = {"episodes": evaluator.rc.eval_episodes, "matches": matches, "mean": {}, "ci": {}, "std": {}, "teams": {}}
    for g, values in returns.items():
        row["mean"][g], row["ci"][g], _ = mean_ci(values)
        row["std"][g] = float(np.std(values))
    for t, values in team_returns.items():
        mean, ci, se = mean_ci(values)
        row["teams"][t] = {"mean": mean, "ci": ci, "se": se}
    names = dict.fromkeys(k for ep in stats for k in ep)
    if names:   # the env's own numbers over every match (a duel's frags)
        row["env"], row["env_ci"] = {}, {}
        for k in names:
            row["env"][k], row["env_ci"][k], _ = mean_ci([ep[k] for ep in stats if k in ep])
    rates = [m["win"] for m in matches.values()]
    row["score"] = float(np.mean(rates))
    row["score_se"] = float(np.sqrt(sum(m["win"] * (1 - m["win"]) / m["episodes"] for m in matches.values()))
                            / len(rates))
    row["score_ci"] = Z95 * row["score_se"]
    row["elo"] = dict(self_play.elo)
    return row


def match_lines(row: dict) -> list[str]:
    """A line per match of an evaluation row: win, draw and loss rates, the win rate's interval."""
    return [f"  vs {m['opponent']} as {m['seat']}: win {m['win']:.3f} [{m['win_low']:.3f}, {m['win_high']:.3f}], "
            f"draw {m['draw']:.3f}, loss {m['loss']:.3f} over {m['episodes']} episodes"
            for m in row.get("matches", {}).values()]

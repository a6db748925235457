"""Match outcomes and Elo ratings: who won an episode between two teams, and what that does to
their ratings."""
from __future__ import annotations

import math

from marlkit.errors import ConfigError
from marlkit.runners.evaluation import team_return

WIN, DRAW, LOSS = 1.0, 0.5, 0.0


def expected_score(rating: float, opponent: float) -> float:
    """The score (1 a win, 0.5 a draw) a player rated ``rating`` expects against ``opponent``."""
    return 1.0 / (1.0 + 10.0 ** ((opponent - rating) / 400.0))


def elo_change(rating: float, opponent: float, result: float, k: float) -> float:
    """What a match with ``result`` (WIN, DRAW or LOSS) adds to ``rating``; the opponent loses as
    much (Elo is zero-sum). ``k``: the most one match can move a rating."""
    return k * (result - expected_score(rating, opponent))


def match_result(episode: dict, mine: list[str], theirs: list[str], agents_of: dict[str, list[str]],
                 outcome: str = "auto") -> float | None:
    """WIN, DRAW or LOSS for the team of groups ``mine`` against the team ``theirs`` in a finished
    ``episode`` (its per-group ``return``, ``final_reward`` and env ``stats``); ``agents_of``:
    group -> its agents; None where a side did not play in it (another field's match ended).

    ``outcome`` (``self_play.outcome``): ``final_reward``, the sign of the team's reward at the
    last step, ML-Agents' convention for its scenes; ``auto``, an env that names a winner
    (``won_<agent>`` statistics: turn-based games) is taken at its word, and otherwise the team
    with the higher return won, which says who won only where the rewards are zero-sum: an
    episode whose team returns do not cancel is refused."""
    if outcome == "final_reward":
        final = team_return({"return": episode.get("final_reward", {})}, mine)
        if final is None or team_return({"return": episode.get("final_reward", {})}, theirs) is None:
            return None
        return WIN if final > 0 else LOSS if final < 0 else DRAW
    stats = episode.get("stats", {})
    if any(f"won_{a}" in stats for g in mine + theirs for a in agents_of[g]):
        won = {side: any(stats.get(f"won_{a}", 0.0) > 0 for g in groups for a in agents_of[g])
               for side, groups in (("mine", mine), ("theirs", theirs))}
        return WIN if won["mine"] and not won["theirs"] else LOSS if won["theirs"] and not won["mine"] else DRAW
    ours, others = team_return(episode, mine), team_return(episode, theirs)
    if ours is None or others is None:
        return None
    scale = max(abs(ours), abs(others), 1.0)
    if abs(ours + others) > 1e-4 * scale:
        raise ConfigError(f"self_play: Elo needs a winner, but this env's rewards are not zero-sum (an episode ended "
                          f"{ours:.3f} to {others:.3f}) and it reports no winner (won_<agent> episode statistics); "
                          "give the env a winner statistic, set self_play.outcome: final_reward where the last "
                          "step's reward tells the winner, or train without self_play")
    return WIN if ours > others else LOSS if ours < others else DRAW


def rate_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's 95% interval of a rate from ``successes`` out of ``n`` (sound at rates near 0 or 1,
    where a win rate of a trained player sits)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)

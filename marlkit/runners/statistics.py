"""The noise in an evaluation: 95% confidence intervals of episode means, and when a new evaluation
beats the best one by more than that noise."""
from __future__ import annotations

import math

import numpy as np

# Student's t, two-sided 95%, by degrees of freedom (1-30); beyond 30 the normal's 1.96 is within 2%
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]
Z95 = 1.96


def t95(dof: int) -> float:
    return _T95[dof - 1] if 1 <= dof <= len(_T95) else Z95


def mean_ci(values) -> tuple[float, float, float]:
    """(mean, half-width of its 95% confidence interval (Student's t), standard error) of per-episode
    ``values``; a single value has an interval of 0 (nothing to tell its noise from)."""
    x = np.asarray(values, np.float64)
    mean = float(x.mean()) if len(x) else float("nan")
    if len(x) < 2:
        return mean, 0.0, 0.0
    se = float(x.std(ddof=1)) / math.sqrt(len(x))
    return mean, t95(len(x) - 1) * se, se


def beats(new: dict, best: dict) -> bool:
    """Whether evaluation ``new`` replaces ``best`` as the best one: its score is higher by more than
    the noise of the two, the 95% interval of their difference (Welch: ``score_new - score_best >
    1.96 * sqrt(se_new**2 + se_best**2)``). A score that is higher within the noise keeps the earlier
    best, which was chosen on as much evidence."""
    margin = Z95 * math.sqrt(new.get("score_se", 0.0) ** 2 + best.get("score_se", 0.0) ** 2)
    return new["score"] - best["score"] > margin

"""A study's numbers, from its runs' benchmark.json files: per env, each agent's final and
best-checkpoint returns and env statistics over seeds (mean with a 95% bootstrap interval, and the
IQM); across envs, scores normalised between each env's random policy (0) and a reference (1), with
rliable's aggregates (IQM, median, mean, optimality gap) and their stratified bootstrap intervals,
performance profiles and the probability of improvement of one agent over another.

A run's "return" is the ``score`` of its evaluation rows: per episode the mean return of the teams
``runner.best_metric`` scores (by default the learning teams), averaged over the evaluation's
episodes. Every bootstrap draws from numpy's global generator (rliable's own choice), seeded with
SEED and restored afterwards, so that a report is the same each time it is written.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from marlkit.errors import ConfigError

# bootstrap resamples: rliable's defaults for intervals (get_interval_estimates) and for curves and
# profiles (create_performance_profile), whose many points each need fewer
REPS = 50_000
CURVE_REPS = 2_000
SEED = 0
AGGREGATES = ("IQM", "Median", "Mean", "Optimality gap")


def require_rliable():
    """rliable's metrics, or a one-line error saying how to install it (checked before a study
    starts, not when its report is due)."""
    try:
        from rliable import metrics
    except ImportError:
        raise ConfigError("marlkit study needs rliable for its statistics and figures; install it with "
                          "pip install -e '.[study]'") from None
    return metrics


@dataclass
class RunRecord:
    """One finished run: ``report`` is its benchmark.json."""

    env: str
    agent: str
    seed: int
    report: dict

    def score(self, row: str) -> float:
        """The return of row ``final``, ``best`` or ``baseline``."""
        return float(self.report[row]["score"])


def load_records(spec, read_benchmark) -> list[RunRecord]:
    """The study's finished runs (a benchmark.json with a final evaluation), in the spec's order."""
    records = []
    for env, agent, seed in spec.runs():
        report = read_benchmark(spec.run_dir(env, agent, seed))
        if report and report.get("final"):
            records.append(RunRecord(Path(env).stem, agent, seed, report))
    return records


@contextlib.contextmanager
def seeded(seed: int = SEED):
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def _percentiles(values: np.ndarray, size: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """arch's percentile interval of bootstrap ``values`` ``[reps, k]``."""
    alpha = 100 * (1 - size) / 2
    lo, hi = np.percentile(values, [alpha, 100 - alpha], axis=0)
    return lo, hi


def stratified_bootstrap(scores: np.ndarray, func, reps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """rliable's ``StratifiedBootstrap`` percentile interval, vectorised: ``scores`` ``[runs, tasks,
    ...]``, resampled runs within each task (and each trailing index); ``func`` maps a batch ``[R,
    runs, tasks, ...]`` to ``[R, k]``. The draws are those rliable makes from numpy's global generator
    (one ``choice(runs, scores.shape)`` per resample), so the interval equals
    ``library.get_interval_estimates``'s for the same generator state. -> (point [k], low [k], high [k])."""
    idx = np.random.choice(scores.shape[0], (reps, *scores.shape), replace=True)
    strata = np.ogrid[tuple(slice(n) for n in scores.shape[1:])]
    resampled = scores[(idx, *[s[None] for s in strata])]
    lo, hi = _percentiles(func(resampled))
    return func(scores[None])[0], lo, hi


def independent_bootstrap(x: np.ndarray, y: np.ndarray, func, reps: int):
    """rliable's ``StratifiedIndependentBootstrap`` (``x`` and ``y`` ``[runs, tasks]`` resampled each
    on its own, within each task), vectorised with its draws in its order: per resample one
    ``choice`` for ``x``, then one for ``y``. ``func`` maps batches ``[R, runs_x, tasks]``, ``[R,
    runs_y, tasks]`` to ``[R, k]``."""
    if x.shape == y.shape:   # one draw of both per resample gives the same numbers in one call
        both = np.random.choice(x.shape[0], (reps, 2, *x.shape), replace=True)
        ix, iy = both[:, 0], both[:, 1]
    else:
        draws = [(np.random.choice(x.shape[0], x.shape), np.random.choice(y.shape[0], y.shape)) for _ in range(reps)]
        ix, iy = np.array([d[0] for d in draws]), np.array([d[1] for d in draws])
    tasks = np.arange(x.shape[1])[None, None, :]
    lo, hi = _percentiles(func(x[ix, tasks], y[iy, tasks]))
    return func(x[None], y[None])[0], lo, hi


def interval_estimates(score_dict: dict, func, reps: int) -> dict:
    """``library.get_interval_estimates`` with vectorised ``func`` (see stratified_bootstrap): the
    keys in order, each bootstrap continuing the generator the one before left, seeded with SEED
    before the first. -> per key (point [k], low [k], high [k])."""
    with seeded():
        return {key: stratified_bootstrap(np.asarray(scores, np.float64), func, reps)
                for key, scores in score_dict.items()}


# batched statistics: ``s`` is [R, runs, tasks] -> [R]; rliable's metrics, one resample per row

def batch_mean(s: np.ndarray) -> np.ndarray:
    return s.mean(axis=1).mean(axis=1)


def batch_median(s: np.ndarray) -> np.ndarray:
    return np.median(s.mean(axis=1), axis=1)


def batch_iqm(s: np.ndarray) -> np.ndarray:
    return scipy_stats().trim_mean(s.reshape(len(s), -1), proportiontocut=0.25, axis=1)


def batch_optimality_gap(s: np.ndarray, gamma: float = 1.0) -> np.ndarray:
    return gamma - np.minimum(s, gamma).reshape(len(s), -1).mean(axis=1)


def batch_improvement(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) per resample: per task the Mann-Whitney U of x over y divided by runs_x * runs_y (ties
    count a half), averaged over tasks; ``x`` [R, runs_x, tasks], ``y`` [R, runs_y, tasks]."""
    greater = (x[:, :, None, :] > y[:, None, :, :]).mean(axis=(1, 2))
    ties = (x[:, :, None, :] == y[:, None, :, :]).mean(axis=(1, 2))
    return (greater + 0.5 * ties).mean(axis=1)


def scipy_stats():
    import scipy.stats
    return scipy.stats


def mean_interval(values) -> tuple[float, float, float]:
    """(mean, low, high): the mean of ``values`` (one per seed) and its 95% percentile bootstrap
    interval (rliable's stratified bootstrap on a single task)."""
    scores = np.asarray(values, np.float64).reshape(-1, 1)   # [seeds, 1 task]
    with seeded():
        point, lo, hi = stratified_bootstrap(scores, lambda s: batch_mean(s)[:, None], REPS)
    return float(point[0]), float(lo[0]), float(hi[0])


def iqm(values) -> float:
    """The interquartile mean (25% trimmed from each end; with fewer than 4 seeds nothing is
    trimmed and it is the mean)."""
    return float(require_rliable().aggregate_iqm(np.asarray(values, np.float64).reshape(-1, 1)))


@dataclass
class Cell:
    """One agent's value on one env over its seeds: mean, 95% interval, IQM and the number of seeds."""

    mean: float
    low: float
    high: float
    iqm: float
    n: int


def cell(values) -> Cell:
    mean, low, high = mean_interval(values)
    return Cell(mean, low, high, iqm(values), len(values))


def per_env(records: list[RunRecord]) -> dict[str, dict]:
    """Per env: ``random`` (mean of the runs' baseline scores), and per agent ``final`` and ``best``
    Cells of the score and ``env`` Cells of each env statistic at the final evaluation."""
    out: dict[str, dict] = {}
    for env in dict.fromkeys(r.env for r in records):
        mine = [r for r in records if r.env == env]
        table = {"random": float(np.mean([r.score("baseline") for r in mine])), "agents": {}}
        for agent in dict.fromkeys(r.agent for r in mine):
            runs = [r for r in mine if r.agent == agent]
            stats = dict.fromkeys(k for r in runs for k in r.report["final"].get("env", {}))
            table["agents"][agent] = {
                "final": cell([r.score("final") for r in runs]),
                "best": cell([r.score("best") for r in runs]),
                "env": {k: cell([r.report["final"]["env"][k] for r in runs if k in r.report["final"].get("env", {})])
                        for k in stats},
                "seeds": [r.seed for r in runs]}
        out[env] = table
    return out


def normalisation(table: dict[str, dict], reference: dict[str, float]) -> dict[str, tuple[float, float, str]]:
    """Per env (random, reference, where the reference came from): the random policy's mean score
    maps to 0 and the reference to 1; the reference is study.yaml's ``reference`` for the env, else
    the best agent's mean final score there."""
    out = {}
    for env, t in table.items():
        if env in reference:
            out[env] = (t["random"], float(reference[env]), "study.yaml")
        else:
            best = max(t["agents"], key=lambda a: t["agents"][a]["final"].mean)
            out[env] = (t["random"], t["agents"][best]["final"].mean, f"{best}'s mean")
    return out


def normalised_scores(records: list[RunRecord], norms: dict, row: str = "final") -> tuple[dict[str, np.ndarray], list[str]]:
    """Per agent a matrix ``[seeds, envs]`` of normalised scores of ``row``, over the seeds the
    agent finished on every env (rliable's layout: runs x tasks), and the envs' order. An env whose
    reference equals its random score cannot be normalised and is left out."""
    envs = [e for e, (lo, hi, _) in norms.items() if hi != lo]
    out = {}
    for agent in dict.fromkeys(r.agent for r in records):
        by = {(r.env, r.seed): r for r in records if r.agent == agent}
        seeds = [s for s in dict.fromkeys(seed for _, seed in by) if all((e, s) in by for e in envs)]
        if seeds and envs:
            out[agent] = np.array([[(by[(e, s)].score(row) - norms[e][0]) / (norms[e][1] - norms[e][0]) for e in envs]
                                   for s in seeds])
    return out, envs


def _aggregate(s: np.ndarray) -> np.ndarray:
    return np.stack([batch_iqm(s), batch_median(s), batch_mean(s), batch_optimality_gap(s)], axis=1)


def aggregates(matrices: dict[str, np.ndarray]) -> dict[str, dict[str, tuple[float, float, float]]]:
    """Per agent, per AGGREGATES name: (point, low, high), 95% stratified bootstrap intervals
    (runs resampled within each env)."""
    found = interval_estimates(matrices, _aggregate, REPS)
    return {a: {name: (float(p[i]), float(lo[i]), float(hi[i])) for i, name in enumerate(AGGREGATES)}
            for a, (p, lo, hi) in found.items()}


def improvement(matrices: dict[str, np.ndarray]) -> dict[tuple[str, str], tuple[float, float, float]]:
    """P(X > Y) for every ordered pair of agents: the probability that a run of X scores above a run
    of Y on an env, averaged over envs, with its 95% bootstrap interval (each agent's runs resampled
    on their own, within each env)."""
    out = {}
    with seeded():
        for x in matrices:
            for y in matrices:
                if x != y:
                    p, lo, hi = independent_bootstrap(matrices[x], matrices[y],
                                                      lambda a, b: batch_improvement(a, b)[:, None], REPS)
                    out[(x, y)] = (float(p[0]), float(lo[0]), float(hi[0]))
    return out


def profiles(matrices: dict[str, np.ndarray], taus: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Performance profiles: per agent the fraction of runs (over every env) whose normalised score
    is above each tau ``[K]``, and its 95% stratified bootstrap interval ``[2, K]`` (rliable's
    ``create_performance_profile`` layout)."""
    def fraction_above(s):
        return (s.reshape(len(s), -1)[:, :, None] > taus).mean(axis=1)

    found = interval_estimates(matrices, fraction_above, CURVE_REPS)
    return {a: (p, np.stack([lo, hi])) for a, (p, lo, hi) in found.items()}


def curve(runs: list[RunRecord]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(steps [T], IQM [T], low [T], high [T]) of the evaluation score over the seeds of ``runs``
    (one agent on one env), at the steps every run evaluated at, the interval a 95% bootstrap over
    the seeds at each step (rliable's sample-efficiency layout ``[seeds, 1 task, T]``)."""
    rows = [{row["step"]: row["score"] for row in r.report["evaluations"]} for r in runs]
    steps = sorted(set.intersection(*(set(r) for r in rows)))
    scores = np.array([[[r[s] for s in steps]] for r in rows], np.float64)

    def iqm_per_step(s):   # [R, seeds, 1, T] -> [R, T]
        flat = np.moveaxis(s, -1, 1).reshape(len(s), s.shape[-1], -1)
        return scipy_stats().trim_mean(flat, proportiontocut=0.25, axis=2)

    point, lo, hi = interval_estimates({"x": scores}, iqm_per_step, CURVE_REPS)["x"]
    return np.array(steps), point, lo, hi

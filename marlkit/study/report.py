"""A study's report, written from its run directories alone (so ``marlkit study --report`` gives the
same files at any time): ``report.md`` (tables), ``results.csv`` (every evaluation of every run) and
the figures ``sample_efficiency.png``, ``performance_profile.png`` and
``probability_of_improvement.png``."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from marlkit.study import stats
from marlkit.study.stats import AGGREGATES, Cell, RunRecord


def fmt_cell(c: Cell) -> str:
    return f"{c.mean:.3f} [{c.low:.3f}, {c.high:.3f}]"


def fmt_interval(point: float, low: float, high: float) -> str:
    return f"{point:.3f} [{low:.3f}, {high:.3f}]"


def write_report(spec, records: list[RunRecord]) -> Path:
    """Every report file in ``spec.root``; -> the path of report.md."""
    root = spec.root
    table = stats.per_env(records)
    norms = stats.normalisation(table, spec.reference)
    matrices, envs = stats.normalised_scores(records, norms)
    summary = stats.aggregates(matrices) if matrices else {}
    better = stats.improvement(matrices) if len(matrices) > 1 else {}
    colors = _colors(spec.agents)
    write_results_csv(records, root / "results.csv")
    _plot_curves(records, table, colors, root / "sample_efficiency.png")
    _plot_profiles(matrices, colors, root / "performance_profile.png")
    _plot_improvement(better, list(matrices), root / "probability_of_improvement.png")

    expected = len(spec.runs())
    lines = [f"# Study `{spec.name}`", "",
             f"{len(spec.agents)} agents x {len(spec.envs)} envs x {len(spec.seeds)} seeds: {', '.join(spec.agents)} "
             f"on {', '.join(Path(e).stem for e in spec.envs)}, seeds {', '.join(map(str, spec.seeds))}; "
             f"{len(records)} of {expected} runs finished.",
             f"Settings of every run: `{_flat(_settings(spec.set)) or 'none'}`.", "",
             "A run's return is the `score` of its evaluations (per episode, the mean return of the teams "
             "`runner.best_metric` scores: by default the learning teams, each against the random policy where "
             "rival teams learn), averaged over the evaluation's "
             "episodes. Intervals are 95% percentile bootstrap intervals over seeds (rliable's stratified "
             f"bootstrap, {stats.REPS:,} resamples); with few seeds they are narrow and optimistic. The IQM trims "
             "a quarter of the seeds from each end (with fewer than 4 seeds it is the mean). The best.pt return "
             "is that of the evaluation each run kept in best.pt (a later one replaces it only when it is better "
             "by more than the noise), chosen on those same evaluations: unlike the final return it is not an "
             "independent estimate.", ""]
    for env, t in table.items():
        lo, hi, source = norms[env]
        stat_names = list(dict.fromkeys(k for a in t["agents"].values() for k in a["env"]))
        lines += [f"## {env}", "",
                  f"Random policy: {lo:.3f} (mean of the runs' baselines); reference (normalised score 1): "
                  f"{hi:.3f} ({source}).", "",
                  "| agent | seeds | final return | final IQM | best.pt return | best.pt IQM |"
                  + "".join(f" final {k} |" for k in stat_names),
                  "| --- | ---: | ---: | ---: | ---: | ---: |" + " ---: |" * len(stat_names)]
        for agent, a in t["agents"].items():
            env_cells = "".join(f" {fmt_cell(a['env'][k])} |" if k in a["env"] else " - |" for k in stat_names)
            lines.append(f"| {agent} | {a['final'].n} | {fmt_cell(a['final'])} | {a['final'].iqm:.3f} | "
                         f"{fmt_cell(a['best'])} | {a['best'].iqm:.3f} |{env_cells}")
        lines.append("")

    lines += ["## Across envs", ""]
    if summary:
        n_runs = {a: m.shape[0] for a, m in matrices.items()}
        lines += [f"Normalised final returns (random 0, reference 1) on {', '.join(envs)}, aggregated over "
                  "every run of every env with 95% stratified bootstrap intervals (runs resampled within each env); "
                  "the optimality gap is how far the runs fall short of 1, on average (lower is better).", "",
                  "| agent | seeds | " + " | ".join(AGGREGATES) + " |",
                  "| --- | ---: |" + " ---: |" * len(AGGREGATES)]
        for agent, values in summary.items():
            lines.append(f"| {agent} | {n_runs[agent]} | " + " | ".join(fmt_interval(*values[k]) for k in AGGREGATES)
                         + " |")
        lines.append("")
    else:
        lines += ["Nothing to aggregate: no agent has finished every env on a common seed yet, or no env's "
                  "reference differs from its random policy's score.", ""]
    if better:
        agents = list(matrices)
        lines += ["Probability of improvement, P(row > column): the chance that a run of the row's agent scores "
                  "above a run of the column's on an env, averaged over envs, with 95% bootstrap intervals.", "",
                  "| P(row > column) | " + " | ".join(agents) + " |", "| --- |" + " ---: |" * len(agents)]
        for x in agents:
            lines.append(f"| {x} | " + " | ".join("-" if x == y else fmt_interval(*better[(x, y)]) for y in agents)
                         + " |")
        lines.append("")
    lines += ["## Figures", "",
              "![sample efficiency](sample_efficiency.png)", "",
              "Sample efficiency: per env, the IQM of the evaluation return over seeds with its 95% bootstrap "
              "band, per agent; the random policy dashed.", ""]
    if matrices:
        lines += ["![performance profile](performance_profile.png)", "",
                  "Performance profile: the fraction of runs (every env) whose normalised final return is above "
                  "each threshold, with 95% bootstrap bands.", ""]
    if better:
        lines += ["![probability of improvement](probability_of_improvement.png)", ""]
    lines += ["## Runs", "",
              "| env | agent | seed | env steps | final return (± 95% over episodes) | best.pt at step | training wall time |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in records:
        final, best = r.report["final"], r.report["best"]
        wall = r.report.get("wall_time_s")
        lines.append(f"| {r.env} | {r.agent} | {r.seed} | {r.report['steps']:,} | {final['score']:.3f} ± "
                     f"{final.get('score_ci', 0.0):.3f} | {best['step']:,} | {f'{wall:.0f} s' if wall else '-'} |")
    lines += ["", "Every evaluation of every run: [results.csv](results.csv)."]
    path = root / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _settings(given: dict) -> dict:
    """The study's settings less ``runner.run_root``: where the runs are written changes no result,
    and a report copied into a repository or a paper should not carry one machine's paths."""
    runner = {k: v for k, v in (given.get("runner") or {}).items() if k != "run_root"}
    return {k: runner if k == "runner" else v for k, v in given.items() if k != "runner" or runner}


def _flat(nested: dict, prefix: str = "") -> str:
    items = []
    for k, v in nested.items():
        if isinstance(v, dict) and v:
            items.append(_flat(v, f"{prefix}{k}."))
        else:
            items.append(f"{prefix}{k}={v}")
    return " ".join(items)


def write_results_csv(records: list[RunRecord], path: Path) -> None:
    """One row per run and evaluation: agent, env, seed, step, the return (``score``) and its 95%
    interval over episodes, each group's mean return and interval, each env statistic and interval."""
    groups = list(dict.fromkeys(g for r in records for row in r.report["evaluations"] for g in row["mean"]))
    env_stats = list(dict.fromkeys(k for r in records for row in r.report["evaluations"] for k in row.get("env", {})))
    header = (["agent", "env", "seed", "step", "return", "return_ci"] + [f"{p}/{g}" for g in groups for p in ("return", "ci")]
              + [f"{p}/{k}" for k in env_stats for p in ("env", "env_ci")])
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        for r in records:
            for row in r.report["evaluations"]:
                values = [r.agent, r.env, r.seed, row["step"], row["score"], row.get("score_ci", "")]
                for g in groups:
                    values += [row["mean"].get(g, ""), row.get("ci", {}).get(g, "")]
                for k in env_stats:
                    values += [row.get("env", {}).get(k, ""), row.get("env_ci", {}).get(k, "")]
                writer.writerow(values)


def _colors(agents: list[str]) -> dict:
    import seaborn as sns
    return dict(zip(agents, sns.color_palette("colorblind", n_colors=max(len(agents), 1))))


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _plot_curves(records: list[RunRecord], table: dict, colors: dict, path: Path) -> None:
    from rliable import plot_utils
    plt = _pyplot()
    envs = list(table)
    fig, axes = plt.subplots(1, max(len(envs), 1), figsize=(6 * max(len(envs), 1), 4.5), squeeze=False)
    for ax, env in zip(axes[0], envs):
        points, intervals, steps = {}, {}, None
        for agent in table[env]["agents"]:
            steps, point, lo, hi = stats.curve([r for r in records if r.env == env and r.agent == agent])
            points[agent], intervals[agent] = point, np.stack([lo, hi])
            plot_utils.plot_sample_efficiency_curve(steps, {agent: point}, {agent: intervals[agent]}, ax=ax,
                                                    colors=colors, xlabel="env steps", ylabel="eval return (IQM)",
                                                    labelsize="large", ticklabelsize="medium", marker=".")
        ax.axhline(table[env]["random"], color="gray", linestyle="--", label="random")
        ax.set_title(env)
        ax.legend(fontsize="medium")
    _save(plt, fig, path)


def _plot_profiles(matrices: dict[str, np.ndarray], colors: dict, path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if matrices:
        from rliable import plot_utils
        values = np.concatenate([m.ravel() for m in matrices.values()])
        taus = np.linspace(min(values.min(), 0.0) - 0.05, max(values.max(), 1.0) + 0.05, 101)
        found = stats.profiles(matrices, taus)
        plot_utils.plot_performance_profiles({a: p for a, (p, _) in found.items()}, taus,
                                             performance_profile_cis={a: ci for a, (_, ci) in found.items()}, ax=ax,
                                             colors=colors, xlabel=r"normalised final return ($\tau$)",
                                             ylabel=r"fraction of runs above $\tau$", labelsize="large",
                                             ticklabelsize="medium", legend=True, legendsize="medium")
    else:
        _say_instead(ax, "no agent finished every env on a common seed")
    _save(plt, fig, path)


def _plot_improvement(better: dict, agents: list[str], path: Path) -> None:
    """P(row > column) as a matrix, each cell with its interval."""
    plt = _pyplot()
    n = len(agents)
    fig, ax = plt.subplots(figsize=(2 + 1.8 * max(n, 1), 1.5 + 1.2 * max(n, 1)))
    if better:
        grid = np.full((n, n), np.nan)
        for (x, y), (p, _, _) in better.items():
            grid[agents.index(x), agents.index(y)] = p
        image = ax.imshow(grid, cmap="RdBu", vmin=0, vmax=1)
        for (x, y), (p, lo, hi) in better.items():
            ax.text(agents.index(y), agents.index(x), f"{p:.2f}\n[{lo:.2f}, {hi:.2f}]", ha="center", va="center",
                    fontsize="small", color="white" if abs(p - 0.5) > 0.3 else "black")
        ax.set_xticks(range(n), agents)
        ax.set_yticks(range(n), agents)
        ax.set_xlabel("Y")
        ax.set_ylabel("X")
        ax.set_title("P(X > Y), 95% intervals")
        fig.colorbar(image, ax=ax, fraction=0.046)
    else:
        _say_instead(ax, "one agent: nothing to compare")
    _save(plt, fig, path)


def _say_instead(ax, text: str) -> None:
    """A sentence where a plot has nothing to show."""
    ax.text(0.5, 0.5, text, ha="center", va="center")
    ax.set_axis_off()


def _save(plt, fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

"""Learning curves from ``benchmarks/learning.py`` results: all agents on mpe_spread in one figure,
or with ``--panels`` one panel per env.

    python benchmarks/learning_curves.py benchmarks/results/learning_*.json \
        [--out docs/img/mpe_spread_learning_curves.png] [--table 500000 2000000]
    python benchmarks/learning_curves.py --panels mpe_tag=benchmarks/results/learning_pooled_mpe_tag.json \
        pursuit=A.json,B.json [--until 200000] --out docs/img/pooled_critic_learning.png

A run's whole evaluation curve comes from its result row (``curve``) or, for rows written before
rows kept it, from the ``benchmark.json`` of its run directory; where neither is left, only the
reported points (``at``) are drawn, as markers. Per agent and step: the mean over seeds, with the
range of the seeds shaded. ``--table`` also prints a Markdown table of the evaluations at those
steps: mean ± sample std over the seeds evaluated near the step, and each seed's value.

``--panels ENV=RESULT[,RESULT...]``: a panel per env, a line per result file (its first run; the
label is the file's tag), up to ``--until`` env steps.

``--benchmarks benchmark.json ... [--stat kills]``: the runs of ``marlkit --benchmark`` (one env,
one agent, a seed each): a panel for the first group's evaluation return and one per env
statistic named, mean over the runs with their range shaded, the random baseline each run
measured as a dashed line (mean over the runs); prints each run's random, final and best rows.
``LABEL=A.json,B.json`` draws those runs as a line of their own (runs of one env in two settings).

    python benchmarks/learning_curves.py --benchmarks benchmarks/results/doom_coop_seed*.json \
        --stat kills --out docs/img/doom_coop_learning_curves.png
    python benchmarks/learning_curves.py --stat kills --out docs/img/doom_coop_bfloat16.png --benchmarks \
        float32=benchmarks/results/doom_coop_seed1.json,benchmarks/results/doom_coop_seed2.json \
        bfloat16=benchmarks/results/doom_coop_bfloat16_seed1.json,benchmarks/results/doom_coop_bfloat16_seed2.json
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import harness

RANDOM_RETURN = -26.6  # uniform random actions, mean over agents (docs/benchmarks.md)


def run_curve(row: dict) -> tuple[list[tuple[int, float]], bool]:
    """``(points, whole)``: the run's evaluations as (step, return), and whether it is the whole curve."""
    if "curve" in row:
        return [(int(s), float(v)) for s, v in row["curve"]], True
    report = Path(row["run_dir"]) / "benchmark.json"
    if report.exists():
        evals = json.loads(report.read_text())["evaluations"]
        return [(int(r["step"]), float(next(iter(r["mean"].values())))) for r in evals], True
    return sorted((int(s), float(v)) for s, v in row["at"].items() if v is not None), False


def markdown_table(by_agent: dict[str, dict[int, dict[int, float]]], steps: list[int]) -> str:
    import statistics
    lines = ["| agent | " + " | ".join(f"@{s:,}" for s in steps) + " |",
             "| --- |" + " ---: |" * len(steps)]
    for agent, seeds in sorted(by_agent.items()):
        cells = []
        for step in steps:
            vals = {seed: harness.value_at(curve, step) for seed, curve in sorted(seeds.items())}
            vals = {seed: v for seed, v in vals.items() if v is not None}
            if not vals:
                cells.append("")
                continue
            spread = f" ± {statistics.stdev(vals.values()):.2f}" if len(vals) > 1 else ""
            each = ", ".join(f"s{seed} {v:.2f}" for seed, v in vals.items())
            cells.append(f"{statistics.mean(vals.values()):.2f}{spread} ({each})")
        lines.append(f"| {agent} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = harness.parser(__doc__, repeats=None, results=False, overrides=False)
    parser.add_argument("results", nargs="*", type=Path)
    parser.add_argument("--out", type=Path, default=None,
                        help="the figure (default docs/img/mpe_spread_learning_curves.png, with --panels "
                             "docs/img/pooled_critic_learning.png)")
    parser.add_argument("--table", nargs="+", type=int, default=[], metavar="STEP")
    parser.add_argument("--panels", nargs="+", default=[], metavar="ENV=RESULT[,RESULT...]",
                        help="one panel per env, one line per result file")
    parser.add_argument("--until", type=int, default=None, help="with --panels: the last env step drawn")
    parser.add_argument("--benchmarks", nargs="+", default=[], metavar="[LABEL=]BENCHMARK_JSON[,...]",
                        help="benchmark.json files of marlkit --benchmark runs of one env; LABEL=A.json,B.json "
                             "draws those runs as a line of their own")
    parser.add_argument("--stat", nargs="*", default=[], help="with --benchmarks: env statistics drawn too")
    args = harness.parse_args(parser)
    if sum(map(bool, (args.results, args.panels, args.benchmarks))) != 1:
        parser.error("give one of: result files, --panels, --benchmarks")
    import matplotlib
    matplotlib.use("Agg")
    if args.benchmarks:
        return benchmark_runs(labelled_runs(args.benchmarks), args.stat, args.out)
    if args.panels:
        return panels(args.panels, args.until, args.out or Path("docs/img/pooled_critic_learning.png"))
    args.out = args.out or Path("docs/img/mpe_spread_learning_curves.png")

    # agent -> seed -> {step: return}; a seed measured in several files keeps every step it has.
    by_agent: dict[str, dict[int, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    whole: dict[str, bool] = defaultdict(bool)
    for path in args.results:
        for agent, rows in json.loads(path.read_text())["runs"].items():
            for row in rows:
                points, is_whole = run_curve(row)
                by_agent[agent][row["seed"]].update(points)
                whole[agent] |= is_whole

    if args.table:
        print(markdown_table(by_agent, args.table))

    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for agent, seeds in sorted(by_agent.items()):
        steps = sorted({s for curve in seeds.values() for s in curve})
        # seeds evaluated on different grids (other rollout sizes, other run lengths) are read
        # at every step by linear interpolation, within the steps each seed covers
        ordered = [sorted(curve.items()) for curve in seeds.values()]
        at_step = [[float(np.interp(s, [x for x, _ in c], [y for _, y in c])) for c in ordered
                    if c[0][0] <= s <= c[-1][0]] for s in steps]
        mean = [np.mean(vals) for vals in at_step]
        low = [min(vals) for vals in at_step]
        high = [max(vals) for vals in at_step]
        counts = [len(vals) for vals in at_step]
        label = f"{agent} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''}"
        if min(counts) < len(seeds):   # seeds run for fewer steps than the longest one
            label += f" to {max(s for s, n in zip(steps, counts) if n == len(seeds)):,}, {counts[-1]} beyond"
        label += ")" if whole[agent] else ", reported points only)"
        line, = ax.plot(steps, mean, "-" if whole[agent] else "o--", label=label)
        ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.15)
    ax.axhline(RANDOM_RETURN, color="gray", ls=":", label=f"random policy ({RANDOM_RETURN})")
    ax.set_xscale("symlog", linthresh=1e5)
    ax.set_xlabel("env steps (linear to 100k, log above)")
    ax.set_ylabel("eval return (mean over agents)")
    ax.set_title("mpe_spread: evaluation return, mean over seeds (range shaded), 2-core CPU")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


def panels(specs: list[str], until: int | None, out: Path) -> None:
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(specs), figsize=(5 * len(specs), 4), squeeze=False)
    for ax, spec in zip(axes[0], specs):
        env, files = spec.split("=", 1)
        for path in files.split(","):
            (agent, rows), = list(json.loads(Path(path).read_text())["runs"].items())[:1]
            points = [(s, v) for s, v in run_curve(rows[0])[0] if until is None or s <= until]
            label = Path(path).stem.removeprefix("learning_")
            ax.plot([s for s, _ in points], [v for _, v in points], "o-", ms=3, label=f"{agent} {label}")
        ax.set_title(env)
        ax.set_xlabel("env steps")
        ax.set_ylabel("eval return (first group, mean over its agents)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("MAPPO's pooled critic: evaluation return (one seed each; step 0 = untrained), 2-core CPU")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


def labelled_runs(specs: list[str]) -> dict[str | None, list[Path]]:
    """``--benchmarks`` as label -> files; files given without a label share the label None."""
    groups: dict[str | None, list[Path]] = defaultdict(list)
    for spec in specs:
        label, sep, files = spec.partition("=")
        if not sep or "/" in label:   # a path of its own, whatever its name holds
            label, files = None, spec
        groups[label] += [Path(f) for f in files.split(",") if f]
    return dict(groups)


def benchmark_runs(groups: dict[str | None, list[Path]], stats: list[str], out: Path | None) -> None:
    import matplotlib.pyplot as plt
    import numpy as np
    lines = {label: [json.loads(p.read_text()) for p in paths] for label, paths in groups.items()}
    everyone = [r for runs in lines.values() for r in runs]
    env, agent = everyone[0]["env"], everyone[0]["agent"]
    others = sorted({f"{r['env']}/{r['agent']}" for r in everyone} - {f"{env}/{agent}"})
    if others:
        raise SystemExit(f"--benchmarks: runs of one env and agent ({env}/{agent}), not also of {', '.join(others)}")
    runs_without = [str(p) for paths in groups.values() for p in paths
                    if not json.loads(p.read_text()).get("baseline")]
    if runs_without:
        raise SystemExit(f"no random baseline in {', '.join(runs_without)} (written before benchmarks measured one)")

    def value(row: dict, key: str | None) -> float:
        return float(next(iter(row["mean"].values()))) if key is None else float(row["env"][key])

    for label, runs in lines.items():
        print(f"{env}, {agent}{f' ({label})' if label else ''}: " + ", ".join(
            f"seed {r['seed']} ({r['steps']:,} steps, {(r['wall_time_s'] or 0) / 60:.1f} min in its last process)"
            for r in runs))
        for key in [None, *stats]:
            name = key or "return"
            cells = [(r["seed"], value(r["baseline"], key), value(r["final"], key), value(r["best"], key))
                     for r in runs]
            print(f"{name}: " + "; ".join(f"seed {s}: random {b:.3f}, final {f:.3f}, best.pt {x:.3f}"
                                          for s, b, f, x in cells))
            finals, randoms = [c[2] for c in cells], [c[1] for c in cells]
            spread = f" ± {np.std(finals, ddof=1):.3f}" if len(finals) > 1 else ""
            print(f"  mean over runs: random {np.mean(randoms):.3f}, final {np.mean(finals):.3f}{spread}")

    fig, axes = plt.subplots(1, 1 + len(stats), figsize=(6 * (1 + len(stats)), 4), squeeze=False)
    for ax, key in zip(axes[0], [None, *stats]):
        for label, runs in lines.items():
            # every run of one config evaluates at the same steps; a run cut short covers a prefix
            steps = sorted({row["step"] for r in runs for row in r["evaluations"]})
            at_step = [[value(row, key) for r in runs for row in r["evaluations"] if row["step"] == s] for s in steps]
            seeds = f"{len(runs)} run{'s' if len(runs) > 1 else ''}"
            line, = ax.plot(steps, [np.mean(v) for v in at_step], "o-", ms=3,
                            label=f"{agent}, {label} ({seeds})" if label else f"{agent} ({seeds})")
            ax.fill_between(steps, [min(v) for v in at_step], [max(v) for v in at_step], color=line.get_color(),
                            alpha=0.15)
        ax.axhline(np.mean([value(r["baseline"], key) for r in everyone]), color="gray", ls="--",
                   label="random policy (measured by each run)")
        ax.set_xlabel("env steps")
        ax.set_ylabel("eval return (first group, mean over its agents)" if key is None else f"{key} per episode")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(f"{env}: {agent}, evaluation mean over runs (range shaded), 2-core CPU")
    fig.tight_layout()
    out = out or Path(f"docs/img/{Path(env).stem}_learning_curves.png")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")

if __name__ == "__main__":
    main()

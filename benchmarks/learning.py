"""Learning curves on mpe_spread (or ``--env``, a packaged env name or YAML): ``--benchmark`` runs for
each agent and seed, then the mean eval return (mean over agents of the episode return, the env's
runner.eval_episodes; the first group's) at chosen step counts.

    python benchmarks/learning.py --agents MAPPO IPPO --seeds 1 2 3 --steps 500000 \
        [--report-at 100000 500000] [--set runner.parallels=32 ...]
    python benchmarks/learning.py --resume runs/learning/mpe_spread/MAT/<run> --report-at 500000 2000000

Runs are sequential (the machine has 2 cores); writes benchmarks/results/learning_<tag>.json with,
per run, the evaluations at the chosen steps and the whole evaluation curve
(``benchmarks/learning_curves.py`` plots them). ``--resume`` continues interrupted runs (the
evaluations made before the interruption are in their checkpoints) instead of starting new ones.
"""
from __future__ import annotations

import statistics

import harness


def main() -> None:
    parser = harness.parser(__doc__, repeats=None)
    parser.add_argument("--env", default="mpe_spread")
    parser.add_argument("--agents", nargs="+", default=["MAPPO", "IPPO"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=500_000)
    parser.add_argument("--report-at", nargs="+", type=int, default=None)
    parser.add_argument("--run-root", default="runs/learning")
    parser.add_argument("--resume", nargs="+", default=[], metavar="RUN_DIR",
                        help="continue these interrupted runs instead of starting --agents x --seeds")
    args = harness.parse_args(parser)
    given = [f"--{k.replace('_', '-')}" for k in ("env", "agents", "seeds", "steps", "set", "run_root")
             if getattr(args, k) != parser.get_default(k)]
    if args.resume and given:
        parser.error(f"--resume continues runs with their own settings; drop {', '.join(given)}")
    report_at = args.report_at or [args.steps]
    overrides = {**args.overrides, "runner": {**args.overrides.get("runner", {}), "total_steps": args.steps,
                                              "run_root": args.run_root, "progress": False}}
    if args.resume:
        jobs = [dict(resume=run_dir, mode="benchmark", **{"runner.progress": False}) for run_dir in args.resume]
    else:
        jobs = [dict(agent=agent, env=args.env, mode="benchmark", seed=seed, logger="tensorboard", **overrides)
                for agent in args.agents for seed in args.seeds]
    import marlkit
    from marlkit.config import load_yaml
    results = {}
    for job in jobs:
        run = marlkit.run(**job)
        saved = load_yaml(run.run_dir / "config.yaml")
        agent, seed = saved["agent"], saved["seed"]
        group = next(iter(run.evaluations[0]["mean"]))
        curve = {r["step"]: r["mean"][group] for r in run.evaluations}
        row = {"seed": seed, "run_dir": str(run.run_dir),
               "steps_per_s": run.metrics.get("perf/env_steps_per_s_overall"),
               "at": {str(s): harness.value_at(curve, s) for s in report_at},
               "best": max(r["mean"][group] for r in run.evaluations),
               "curve": [[s, v] for s, v in curve.items()]}
        results.setdefault(agent, []).append(row)
        at = ", ".join(f"{s}: {'-' if v is None else f'{v:.2f}'}" for s, v in row["at"].items())
        print(f"{agent} seed {seed}: {at}"
              + f", best {row['best']:.2f}, {row['steps_per_s']:.0f} env-steps/s", flush=True)
    summary, rows = {}, []
    for agent, runs in results.items():
        summary[agent] = {}
        for s in report_at:
            vals = [r["at"][str(s)] for r in runs]
            known = [v for v in vals if v is not None]   # None: no evaluation within 5% of the step
            mean = statistics.mean(known) if known else float("nan")
            spread = statistics.stdev(known) if len(known) > 1 else 0.0
            summary[agent][str(s)] = {"mean": mean, "std": spread, "per_seed": vals}
        rows.append([agent, *(f"{summary[agent][str(s)]['mean']:.2f} ± {summary[agent][str(s)]['std']:.2f}"
                              for s in report_at)])
    harness.write_results("learning", args, {"overrides": {} if args.resume else overrides, "resumed": args.resume,
                                             "summary": summary, "runs": results})
    harness.table(["agent", *(f"@{s}" for s in report_at)], rows)


if __name__ == "__main__":
    main()

"""A study's wall time with runs side by side (``--jobs 2`` by default) against the same runs one
after another: the study with ``--jobs 1``, and each run as a ``marlkit --benchmark`` command of its
own (what running them without a study is). Whole processes, start to exit, in a fresh directory
each time, the three in turn for every repeat.

    .venv/bin/python benchmarks/study_jobs.py [--agents MAPPO IPPO] [--envs mpe_spread lbf_8x8_2p_2f_coop]
        [--seeds 1 2 3] [--jobs 2] [--repeats 1] [--set KEY=VALUE ...] [--tag NAME | --out FILE]

Default budget: 10,000 env steps per run, evaluated at 5,000 and at the end. With ``--jobs 1`` a run
has every core for its env workers; with ``--jobs N`` each of the N runs has ``cores // N``
(docs/studies.md). Results: benchmarks/results/study_jobs_<TAG>.json.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import harness

SETTINGS = ["runner.total_steps=10000", "runner.eval_interval=5000", "runner.save_interval=5000"]


def main() -> None:
    p = harness.parser(__doc__, repeats=1)
    p.add_argument("--agents", nargs="+", default=["MAPPO", "IPPO"])
    p.add_argument("--envs", nargs="+", default=["mpe_spread", "lbf_8x8_2p_2f_coop"])
    p.add_argument("--seeds", nargs="+", default=["1", "2", "3"])
    p.add_argument("--jobs", type=int, default=2, help="runs at once on the side-by-side side")
    args = harness.parse_args(p)
    scratch = Path(tempfile.mkdtemp(prefix="marlkit-study-jobs-"))

    def study(jobs: int):
        def side() -> dict:
            root = Path(tempfile.mkdtemp(dir=scratch))
            cmd = [sys.executable, "-m", "marlkit", "study", "--agents", *args.agents, "--envs", *args.envs,
                   "--seeds", *args.seeds, "--name", "timed", "--jobs", str(jobs),
                   "--set", *SETTINGS, *args.set, f"runner.run_root={root}"]
            seconds = harness.time_process(cmd)
            runs = list((root / "studies" / "timed").rglob("benchmark.json"))
            finals = [json.loads(r.read_text())["final"]["score"] for r in runs]
            return {"wall_s": seconds, "runs": len(runs), "mean_final_score": sum(finals) / max(len(finals), 1)}
        return side

    def commands() -> dict:
        root = Path(tempfile.mkdtemp(dir=scratch))
        start = time.perf_counter()
        for agent in args.agents:
            for env in args.envs:
                for seed in args.seeds:
                    harness.time_process([sys.executable, "-m", "marlkit", "--agent", agent, "--env", env,
                                          "--seed", seed, "--benchmark", "--set", *SETTINGS, *args.set,
                                          f"runner.run_root={root}"])
        runs = list(root.rglob("benchmark.json"))
        finals = [json.loads(r.read_text())["final"]["score"] for r in runs]
        return {"wall_s": time.perf_counter() - start, "runs": len(runs),
                "mean_final_score": sum(finals) / max(len(finals), 1)}

    serial, commands_side, parallel = ("one after another (--jobs 1)", "one after another (marlkit --benchmark each)",
                                       f"side by side (--jobs {args.jobs})")
    sides = {serial: study(1), commands_side: commands, parallel: study(args.jobs)}
    try:
        samples, medians = harness.measure(sides, args.repeats, label="study ")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    ratios = {base: [p["wall_s"] / b["wall_s"] for b, p in zip(samples[base], samples[parallel])]
              for base in (serial, commands_side)}
    harness.table(["side", "wall s (median)", "runs"], [[n, m["wall_s"], m["runs"]] for n, m in medians.items()])
    of_medians = {base: medians[parallel]["wall_s"] / medians[base]["wall_s"] for base in ratios}
    for base, per_repeat in ratios.items():
        print(f"side by side / {base}: {of_medians[base]:.3f} (per repeat: "
              f"{', '.join(f'{r:.3f}' for r in per_repeat)})")
    harness.write_results("study_jobs", args, {
        "agents": args.agents, "envs": args.envs, "seeds": args.seeds, "settings": SETTINGS + args.set,
        "jobs": args.jobs, "samples": samples, "medians": medians, "ratio_per_repeat": ratios,
        "ratio_of_medians": of_medians})


if __name__ == "__main__":
    main()

"""Settings side by side: one ``--benchmark`` run per variant (a named list of ``--set`` overrides),
all at once, each a single-core process, every one stopped at the same wall-clock limit. The
evaluation curves are read back from the runs' TensorBoard events, so a run cut at the limit still
counts up to its last evaluation.

    .venv/bin/python benchmarks/variants.py --agent QMIX --env lbf_8x8_2p_2f_coop --seed 1 \\
        --wall 450 --variants benchmarks/variants/qmix_lbf.yaml [--set KEY=VALUE ...] [--tag NAME]

The variants file maps a name to its overrides (``{eps200k: [QMIX.epsilon_anneal_steps=200000]}``);
an agent's keys may be written ``AGENT.key`` and are expanded to ``agents.AGENT.key``. Made for a
machine with at least as many cores as variants: on fewer, the runs share cores and their
env-steps are not comparable. Results: benchmarks/results/variants_<TAG>.json (a run that left no
evaluation keeps its log's tail there); the runs' directories are removed.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

import harness

SETTINGS = ["runner.vectorize=sync", "runner.torch_threads=1", "runner.progress=false", "logger=tensorboard",
            "runner.save_interval=10000000"]


def expand(override: str, agent: str) -> str:
    key = override.split("=", 1)[0]
    return f"agents.{override}" if key.startswith(agent + ".") else override


def curve(run_dir: Path) -> dict:
    """Every evaluation's mean return of the learning groups, and the env-steps reached."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    points: dict[int, list[float]] = {}
    steps = 0
    for events in run_dir.rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            scalars = acc.Scalars(tag)
            steps = max([steps] + [s.step for s in scalars])
            if tag.startswith("eval/") and tag.endswith("/return") and not tag.startswith("eval/env/"):
                for s in scalars:
                    points.setdefault(s.step, []).append(s.value)
    evals = [[step, sum(v) / len(v)] for step, v in sorted(points.items())]
    return {"env_steps": steps, "evaluations": evals,
            "last": evals[-1][1] if evals else None, "best": max((v for _, v in evals), default=None)}


def main() -> None:
    p = harness.parser(__doc__, repeats=None)
    p.add_argument("--agent", required=True)
    p.add_argument("--env", required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--variants", required=True, help="YAML: variant name -> list of overrides")
    p.add_argument("--wall", type=float, default=450.0, help="seconds each run may train")
    p.add_argument("--steps", type=int, default=2_000_000, help="runner.total_steps (the wall limit stops first)")
    args = harness.parse_args(p)
    variants = yaml.safe_load(Path(args.variants).read_text())
    root = Path(tempfile.mkdtemp(prefix="marlkit-variants-"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    procs = {}
    for name, overrides in variants.items():
        cmd = [sys.executable, "-m", "marlkit", "--agent", args.agent, "--env", args.env, "--benchmark",
               "--seed", str(args.seed), "--set", *SETTINGS, f"runner.total_steps={args.steps}",
               f"runner.run_root={root / name}", *args.set, *(expand(o, args.agent) for o in overrides or [])]
        log = open(root / f"{name}.log", "w")
        procs[name] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True), cmd, log)
    deadline = time.monotonic() + args.wall
    while time.monotonic() < deadline and any(p.poll() is None for p, _, _ in procs.values()):
        time.sleep(2.0)
    for proc, _, _ in procs.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)   # marlkit saves and exits; the events are flushed
    for proc, _, log in procs.values():
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    results = {}
    for name, (proc, cmd, _) in procs.items():
        results[name] = {"command": " ".join(cmd), "exit_code": proc.returncode, **curve(root / name)}
        if results[name]["last"] is None:
            results[name]["log_tail"] = (root / f"{name}.log").read_text()[-2000:]
    shutil.rmtree(root, ignore_errors=True)
    rows = [[n, r["env_steps"], r["best"], r["last"]] for n, r in results.items()]
    harness.table(["variant", "env steps", "best eval", "last eval"], rows)
    harness.write_results("variants", args, {"agent": args.agent, "env": args.env, "seed": args.seed,
                                             "wall_s": args.wall, "settings": SETTINGS, "variants": variants,
                                             "results": results})


if __name__ == "__main__":
    main()

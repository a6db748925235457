"""The env side alone: CPU seconds per 10,000 env steps of uniformly random actions through marlkit's
vector env (adapter, batching, auto-reset; no agent learns), for packaged envs, in this checkout
against another (``--against``), the two taking turns as whole processes.

    python benchmarks/env_side.py [--envs mettagrid lbf_8x8_2p_2f_coop rware_tiny_2ag] [--steps 40000]
                                  [--against OTHER_CHECKOUT] [--repeats 3] [--tag NAME]

Every env is stepped in one process (``runner.vectorize: sync``, its YAML's ``runner.parallels``),
so that the process's CPU time is the env side's. A measurement is a process of its own running
``--side`` under this Python with the checkout's folder first on ``sys.path``; CPU time is that of
the stepping loop alone (``time.process_time``), with one torch thread. With ``--against``, this
checkout's figure over the other's is the ratio the docs quote (below 1: less CPU here).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import harness

HERE = Path(__file__).resolve().parents[1]


def side(checkout: Path, env: str, steps: int) -> dict:
    """CPU and wall seconds per 10,000 env steps of ``env`` with ``checkout``'s marlkit."""
    os.environ["OMP_NUM_THREADS"] = "1"
    sys.path.insert(0, str(checkout))
    import torch
    torch.set_num_threads(1)
    import marlkit
    assert Path(marlkit.__file__).resolve().is_relative_to(checkout), marlkit.__file__
    cfg = marlkit.build_config(agent="MAPPO", env=env, **{"runner.vectorize": "sync"})
    stats: dict = {}
    cpu = time.process_time()
    harness.random_steps_per_s(cfg, steps, stats=stats)
    cpu = time.process_time() - cpu
    per = 10_000 / stats["env_steps"]
    return {"cpu_s_per_10k": cpu * per, "wall_s_per_10k": stats["seconds"] * per,
            "env_steps_per_s": stats["env_steps"] / stats["seconds"], "envs": cfg.runner.parallels}


def run_side(checkout: Path, env: str, steps: int) -> dict:
    done = subprocess.run([sys.executable, __file__, "--side", str(checkout), env, str(steps)],
                          capture_output=True, text=True, cwd=HERE)
    if done.returncode != 0:
        raise RuntimeError(f"{checkout} on {env} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    if sys.argv[1:2] == ["--side"]:
        print(json.dumps(side(Path(sys.argv[2]).resolve(), sys.argv[3], int(sys.argv[4]))))
        return
    p = harness.parser(__doc__, overrides=False)
    p.add_argument("--envs", nargs="+", default=["mettagrid", "lbf_8x8_2p_2f_coop", "rware_tiny_2ag"])
    p.add_argument("--steps", type=int, default=40_000, help="env steps per measurement")
    p.add_argument("--against", type=Path, default=None, help="another checkout of marlkit to compare with")
    args = harness.parse_args(p)
    checkouts = {"this": HERE} | ({"against": args.against.resolve()} if args.against else {})
    results, rows = {}, []
    for env in args.envs:
        samples, medians = harness.measure({name: (lambda c=c: run_side(c, env, args.steps))
                                            for name, c in checkouts.items()}, args.repeats, f"{env}: ")
        results[env] = {"samples": samples, "medians": medians}
        row = [env] + [f"{medians[n]['cpu_s_per_10k']:.2f}" for n in checkouts]
        if args.against:
            ratio = medians["this"]["cpu_s_per_10k"] / medians["against"]["cpu_s_per_10k"]
            results[env]["cpu_ratio"] = ratio
            row.append(f"{ratio:.2f}x")
        rows.append(row)
    harness.table(["env"] + [f"CPU s / 10k steps, {n}" for n in checkouts] + (["this / against"] if args.against else []),
                  rows)
    harness.write_results("env_side", args, {"checkouts": {n: str(c) for n, c in checkouts.items()},
                                             "steps": args.steps, "envs": results})


if __name__ == "__main__":
    main()

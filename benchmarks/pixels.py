"""Pixels at any size: MAPPO training with the packaged defaults on PettingZoo's
cooperative_pong_v6 (two paddles, 280x480x3 screens; ``--env pistonball``: 20 pistons, 457x120x3
views; ``--env kaz_image``: knights_archers_zombies with 512x512x3 views) vs random-action stepping
through marlkit's vector env, at the same vectorisation, measured alternately in one process. Run
it under ``/usr/bin/time -v`` for the peak RSS of both.

    python benchmarks/pixels.py [--env NAME] [--steps 4000] [--parallels 8] [--repeats 2] [--set KEY=VALUE ...] [--tag NAME]

With the defaults the screens reach the agents shrunk by block means to 56x60 (``env.max_image_side``),
and MAPPO's critic pools the two paddles' views (the env's image ``state()`` is not read). ``--set
env.max_image_side=null agents.MAPPO.critic_input=state env.state=env`` gives the full-size setup.
Writes benchmarks/results/pixels[_ENV][_NAME].json. Needs pygame and pymunk (``pip install -e .[games]``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import yaml

import marlkit
from marlkit.api import build_config
from marlkit.config import parse_set

from throughput import raw_vector_steps_per_s

ENVS = {
    "cooperative_pong": {"description": "PettingZoo butterfly cooperative_pong_v6, 2 paddles, 280x480x3 screens",
                         "env": {"type": "pettingzoo", "factory": "pettingzoo.butterfly.cooperative_pong_v6:parallel_env"}},
    "pistonball": {"description": "PettingZoo butterfly pistonball_v6, 20 pistons, 457x120x3 views",
                   "env": {"type": "pettingzoo", "factory": "pettingzoo.butterfly.pistonball_v6:parallel_env"}},
    "kaz_image": {"description": "PettingZoo butterfly knights_archers_zombies_v11, 512x512x3 views",
                  "env": {"type": "pettingzoo", "factory": "pettingzoo.butterfly.knights_archers_zombies_v11:parallel_env",
                          "kwargs": {"obs_method": "image"}}},
}


def train_steps_per_s(path: str, overrides: dict, steps: int) -> float:
    with tempfile.TemporaryDirectory() as root:
        result = marlkit.run(agent="MAPPO", env=path, logger="none", **{
            **overrides, "runner.total_steps": steps, "runner.progress": False, "runner.run_root": root,
            "runner.save_interval": 10 ** 9})
    return result.metrics["perf/env_steps_per_s_overall"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", choices=sorted(ENVS), default="cooperative_pong")
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--parallels", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    torch.set_num_threads(1)
    overrides = {**parse_set(args.set), "runner.parallels": args.parallels, "runner.vectorize": "sync"}
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / f"{args.env}.yaml")
        Path(path).write_text(yaml.safe_dump(ENVS[args.env]))
        cfg = build_config("MAPPO", path, **overrides)
        rows = {"random": [], "train": []}
        for r in range(args.repeats):
            rows["random"].append(raw_vector_steps_per_s(cfg, args.steps))
            rows["train"].append(train_steps_per_s(path, overrides, args.steps))
            print(f"repeat {r + 1}/{args.repeats}: random {rows['random'][-1]:.0f}, train {rows['train'][-1]:.0f} "
                  "env-steps/s", flush=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    report = {"env": args.env, "parallels": args.parallels, "steps_per_measurement": args.steps, "repeats": args.repeats,
              "overrides": args.set, "samples": rows, "median_env_steps_per_s": med,
              "train_over_random": med["train"] / med["random"],
              "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared), Python {platform.python_version()}",
              "torch": torch.__version__}
    name = "pixels" + ("" if args.env == "cooperative_pong" else f"_{args.env}") + (f"_{args.tag}" if args.tag else "")
    out = Path(__file__).parent / "results" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"MAPPO training / random-action stepping = {report['train_over_random']:.3f} "
          f"({med['train']:.1f} vs {med['random']:.1f} env-steps/s); written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

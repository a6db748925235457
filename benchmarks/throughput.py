"""Env-steps/s of training on mpe_spread (MAPPO, or the agents named by ``--agent``) vs raw env
stepping with random actions, at the same vectorisation, measured alternately in one process so all
see the same machine load.

    python benchmarks/throughput.py [--agent MAPPO [COMA ...]] [--steps 100000] [--parallels 16]
                                    [--vectorize sync] [--repeats 3] [--set agents.MAPPO.epochs=5 ...] [--tag NAME]

Prints a table and writes benchmarks/results/throughput[_NAME].json. "raw" uses the same vector env the
trainer uses (marlkit's PettingZoo adapter, auto-reset, batching) with uniformly random actions;
"bare mpe2" is a plain loop over one mpe2 env for reference.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import marlkit
from marlkit.agents.random_policy import RandomAgent
from marlkit.api import build_config
from marlkit.config import parse_set
from marlkit.envs.factory import make_env_vector


def raw_vector_steps_per_s(cfg, steps: int) -> float:
    venv = make_env_vector(cfg.env, cfg.runner)
    try:
        agents = {g: RandomAgent(gs, venv.spec.state_shape, None, venv.num_envs, 1, seed=i)
                  for i, (g, gs) in enumerate(venv.spec.groups.items())}
        obs = venv.reset(seed=0)
        n_steps = steps // venv.num_envs
        start = time.perf_counter()
        for _ in range(n_steps):
            actions = {g: a.act(obs.obs[g], obs.state, obs.agent_mask[g], obs.action_mask[g], None).actions
                       for g, a in agents.items()}
            obs = venv.step(actions).next
        return n_steps * venv.num_envs / (time.perf_counter() - start)
    finally:
        venv.close()


def bare_mpe2_steps_per_s(steps: int) -> float:
    from mpe2 import simple_spread_v3
    env = simple_spread_v3.parallel_env(N=3, max_cycles=25)
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    start = time.perf_counter()
    for _ in range(steps):
        if not env.agents:
            env.reset()
        env.step({a: int(rng.integers(5)) for a in env.agents})
    return steps / (time.perf_counter() - start)


def train_steps_per_s(args, agent: str, steps: int) -> float:
    with tempfile.TemporaryDirectory() as root:
        result = marlkit.run(agent=agent, env="mpe_spread", logger="none", **{
            **args.overrides, "runner.total_steps": steps, "runner.parallels": args.parallels,
            "runner.vectorize": args.vectorize, "runner.progress": False, "runner.run_root": root,
            "runner.save_interval": 10 ** 9})
    return result.metrics["perf/env_steps_per_s_overall"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agent", nargs="+", default=["MAPPO"], help="one or more agents, trained in turn each repeat")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--parallels", type=int, default=16)
    parser.add_argument("--vectorize", default="sync", choices=["sync", "subprocess"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="training config overrides")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    args.overrides = parse_set(args.set)
    out = Path(__file__).parent / "results" / f"throughput{('_' + args.tag) if args.tag else ''}.json"
    torch.set_num_threads(1)
    cfg = build_config(args.agent[0], "mpe_spread", **{"runner.parallels": args.parallels,
                                                   "runner.vectorize": args.vectorize})
    trains = {agent: ("train" if i == 0 else f"train_{agent}") for i, agent in enumerate(args.agent)}
    rows = {"bare_mpe2": [], "raw": [], **{key: [] for key in trains.values()}}
    for r in range(args.repeats):
        rows["bare_mpe2"].append(bare_mpe2_steps_per_s(args.steps // 4))
        rows["raw"].append(raw_vector_steps_per_s(cfg, args.steps))
        for agent, key in trains.items():
            rows[key].append(train_steps_per_s(args, agent, args.steps))
        print(f"repeat {r + 1}/{args.repeats}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in rows.items()),
              flush=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    ratio = med["train"] / med["raw"]
    report = {"agent": args.agent[0] if len(args.agent) == 1 else args.agent, "parallels": args.parallels,
              "vectorize": args.vectorize, "overrides": args.set,
              "steps_per_measurement": args.steps, "repeats": args.repeats, "samples": rows,
              "median_env_steps_per_s": med, "train_over_raw": ratio,
              **({"over_first_agent": {a: med[k] / med["train"] for a, k in trains.items()}}
                 if len(trains) > 1 else {}),
              "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores, {platform.python_version()}",
              "torch": torch.__version__}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"\n{'workload':<34}{'env-steps/s (median)':>22}")
    print(f"{'bare mpe2, 1 env, random':<34}{med['bare_mpe2']:>22.0f}")
    print(f"{f'raw vector env x{args.parallels} ({args.vectorize}), random':<34}{med['raw']:>22.0f}")
    for agent, key in trains.items():
        print(f"{f'{agent} training x{args.parallels} ({args.vectorize})':<34}{med[key]:>22.0f}")
    print(f"{args.agent[0]} train / raw = {ratio:.2f} (target >= 0.80)")
    for agent, key in list(trains.items())[1:]:
        print(f"{agent} / {args.agent[0]} training = {med[key] / med['train']:.2f}")


if __name__ == "__main__":
    sys.exit(main())

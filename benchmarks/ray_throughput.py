"""Env-steps/s of the vector-env backends side by side, and the bytes a Ray step moves.

    python benchmarks/ray_throughput.py [--env mpe_spread doom_coop] [--steps 4000 1200] [--repeats 3]
                                        [--train] [--round-trip STEPS] [--tag NAME]

For each env, ``runner.vectorize`` sync, subprocess and ray (a two-node Ray cluster on this machine,
every node bound to 127.0.0.1, one CPU per node, one actor per node) step the env's own YAML
settings with uniformly random actions, alternately within one process so that all see the same
machine load; the median of ``--repeats`` is reported. "bytes/step" is the payload of one vector
step through Ray (actions out, arrays back, summed over actors), from the backend's own counters.
``--train`` also times MAPPO training with ``vectorize: sync`` (the learner's cost per env step is
1/train - 1/sync). Writes benchmarks/results/ray_throughput[_NAME].json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

from doom_throughput import cpu_model, train_steps_per_s

from marlkit.agents.random_policy import RandomAgent
from marlkit.api import build_config
from marlkit.envs.factory import make_env_vector
from marlkit.envs.ray_vector import loopback_cluster

MODES = ["sync", "subprocess", "ray"]


def steps_per_s(cfg, vectorize: str, steps: int) -> tuple[float, float | None]:
    """(env-steps/s, bytes per vector step through Ray or None) with random actions."""
    venv = make_env_vector(cfg.env, replace(cfg.runner, vectorize=vectorize))
    try:
        agents = {g: RandomAgent(gs, venv.spec.state_shape, None, venv.num_envs, 1, seed=i)
                  for i, (g, gs) in enumerate(venv.spec.groups.items())}
        obs = venv.reset(seed=0)
        rounds = max(1, steps // venv.num_envs)
        moved = getattr(venv, "bytes_sent", 0) + getattr(venv, "bytes_received", 0)
        start = time.perf_counter()
        for _ in range(rounds):
            actions = {g: a.act(obs.obs[g], obs.state, obs.agent_mask[g], obs.action_mask[g], None).actions
                       for g, a in agents.items()}
            obs = venv.step(actions).next
        rate = rounds * venv.num_envs / (time.perf_counter() - start)
        if vectorize != "ray":
            return rate, None
        return rate, (venv.bytes_sent + venv.bytes_received - moved) / rounds
    finally:
        venv.close()


def round_trip_ms(steps: int) -> dict:
    """Per vector step of 2 mpe_spread envs: ray with 1 and 2 actors minus in process, in ms."""
    cfg = build_config("MAPPO", "mpe_spread", "train", **{"runner.parallels": 2})
    per_step = {}
    for name, vectorize, workers in (("sync", "sync", 1), ("ray_1", "ray", 1), ("ray_2", "ray", 2)):
        rate, _ = steps_per_s(replace(cfg, runner=replace(cfg.runner, workers=workers)), vectorize, steps)
        per_step[name] = 2e3 / rate
    return {"one_actor": per_step["ray_1"] - per_step["sync"], "per_further_actor": per_step["ray_2"] - per_step["ray_1"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", nargs="*", default=["mpe_spread", "doom_coop"])
    parser.add_argument("--steps", nargs="+", type=int, default=[4000, 1200], help="env steps per measurement, per env")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train", action="store_true", help="also time MAPPO training with vectorize: sync")
    parser.add_argument("--round-trip", type=int, default=0, metavar="STEPS",
                        help="also time one Ray call per step (mpe_spread, 2 envs) over STEPS env steps")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    rows = []
    with loopback_cluster(nodes=2, cpus_per_node=1):
        for env, steps in zip(args.env, args.steps):
            cfg = build_config("MAPPO", env, "train", **{"runner.workers": 2, "runner.ray_cpus_per_worker": 1})
            rates = {m: [] for m in MODES}
            payload = None
            for _ in range(args.repeats):
                for mode in MODES:
                    rate, moved = steps_per_s(cfg, mode, steps)
                    rates[mode].append(rate)
                    payload = moved if moved is not None else payload
            row = {"env": env, "envs": cfg.runner.parallels, "workers": 2, "steps": steps,
                   **{f"{m}_steps_per_s": statistics.median(r) for m, r in rates.items()},
                   "all": rates, "ray_bytes_per_step": payload,
                   "ray_bytes_per_env_step": payload / cfg.runner.parallels}
            if args.train:
                row["train_sync_steps_per_s"] = train_steps_per_s(steps, {"runner.vectorize": "sync"}) \
                    if env == "doom_coop" else None
            rows.append(row)
            print(f"{env:12s} E={row['envs']:3d}  " + "  ".join(f"{m} {row[f'{m}_steps_per_s']:8.0f}" for m in MODES)
                  + f"  env-steps/s;  ray {payload:,.0f} B/step ({row['ray_bytes_per_env_step']:,.0f} B/env-step)"
                  + (f"; train(sync) {row['train_sync_steps_per_s']:.0f}" if row.get("train_sync_steps_per_s") else ""),
                  flush=True)
        trip = round_trip_ms(args.round_trip) if args.round_trip else None
        if trip:
            print(f"ray round trip per vector step: {trip['one_actor']:.2f} ms with one actor, "
                  f"+{trip['per_further_actor']:.2f} ms per further actor")
    out = Path(__file__).parent / "results" / f"ray_throughput{'_' + args.tag if args.tag else ''}.json"
    out.write_text(json.dumps({"cpu": cpu_model(), "rows": rows, "round_trip_ms": trip}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

"""Env-steps/s of the vector-env backends side by side, and the bytes a Ray step moves.

    python benchmarks/ray_throughput.py [--env mpe_spread doom_coop] [--steps 4000 1200] [--repeats 3]
                                        [--train] [--round-trip STEPS] [--set KEY=VALUE ...] [--tag NAME]

For each env, ``runner.vectorize`` sync, subprocess and ray (a two-node Ray cluster on this machine,
every node bound to 127.0.0.1, one CPU per node, one actor per node) step the env's own YAML
settings with uniformly random actions, alternately within one process so that all see the same
machine load; the median of ``--repeats`` is reported. "bytes/step" is the payload of one vector
step through Ray (actions out, arrays back, summed over actors), from the backend's own counters.
``--train`` also times MAPPO training with ``vectorize: sync`` (the learner's cost per env step is
1/train - 1/sync). Writes benchmarks/results/ray_throughput[_NAME].json.
"""
from __future__ import annotations

from dataclasses import replace

import harness

MODES = ["sync", "subprocess", "ray"]


def round_trip_ms(steps: int, overrides: dict) -> dict:
    """Per vector step of 2 mpe_spread envs: ray with 1 and 2 actors minus in process, in ms."""
    from marlkit.api import build_config
    cfg = build_config("MAPPO", "mpe_spread", "train", overrides=overrides, **{"runner.parallels": 2})
    per_step = {}
    for name, vectorize, workers in (("sync", "sync", 1), ("ray_1", "ray", 1), ("ray_2", "ray", 2)):
        runner = replace(cfg.runner, vectorize=vectorize, workers=workers)
        rate = harness.random_steps_per_s(cfg, steps, runner=runner)
        per_step[name] = 2e3 / rate
    return {"one_actor": per_step["ray_1"] - per_step["sync"], "per_further_actor": per_step["ray_2"] - per_step["ray_1"]}


def main() -> None:
    p = harness.parser(__doc__)
    p.add_argument("--env", nargs="*", default=["mpe_spread", "doom_coop"])
    p.add_argument("--steps", nargs="+", type=int, default=[4000, 1200], help="env steps per measurement, per env")
    p.add_argument("--train", action="store_true", help="also time MAPPO training with vectorize: sync")
    p.add_argument("--round-trip", type=int, default=0, metavar="STEPS",
                   help="also time one Ray call per step (mpe_spread, 2 envs) over STEPS env steps")
    args = harness.parse_args(p)

    from marlkit.api import build_config
    from marlkit.envs.ray_cluster import loopback_cluster
    rows = []
    with loopback_cluster(nodes=2, cpus_per_node=1):
        for env, steps in zip(args.env, args.steps):
            cfg = build_config("MAPPO", env, "train", overrides=args.overrides,
                               **{"runner.workers": 2, "runner.ray_cpus_per_worker": 1})
            stats = {m: {} for m in MODES}
            rates, med = harness.measure({m: lambda m=m: harness.random_steps_per_s(
                cfg, steps, runner=replace(cfg.runner, vectorize=m), stats=stats[m]) for m in MODES},
                args.repeats, label=f"{env}: ")
            payload = stats["ray"]["bytes_per_vector_step"]
            row = {"env": env, "envs": cfg.runner.parallels, "workers": 2, "steps": steps,
                   **{f"{m}_steps_per_s": med[m] for m in MODES},
                   "all": rates, "ray_bytes_per_step": payload,
                   "ray_bytes_per_env_step": payload / cfg.runner.parallels}
            if args.train:
                row["train_sync_steps_per_s"] = harness.train_steps_per_s(
                    "MAPPO", "doom_coop", steps, {**args.overrides, "runner.vectorize": "sync"}) \
                    if env == "doom_coop" else None
            rows.append(row)
        trip = round_trip_ms(args.round_trip, args.overrides) if args.round_trip else None
    harness.write_results("ray_throughput", args, {"rows": rows, "round_trip_ms": trip})
    harness.table(["env", "envs", *(f"{m} env-steps/s" for m in MODES), "ray B/step", "ray B/env-step", "train (sync)"],
                  [[r["env"], r["envs"], *(r[f"{m}_steps_per_s"] for m in MODES), r["ray_bytes_per_step"],
                    r["ray_bytes_per_env_step"], r.get("train_sync_steps_per_s")] for r in rows])
    if trip:
        print(f"ray round trip per vector step: {trip['one_actor']:.2f} ms with one actor, "
              f"+{trip['per_further_actor']:.2f} ms per further actor")


if __name__ == "__main__":
    main()

"""Training vs random-action stepping through the same vector env, for any packaged env or env YAML.

    python benchmarks/throughput.py [--env mpe_spread|PATH.yaml] [--agent MAPPO [COMA ...]] [--steps 100000]
                                    [--parallels E] [--vectorize V] [--without-overlap] [--repeats 3]
                                    [--set KEY=VALUE ...] [--tag NAME]
    python benchmarks/throughput.py --whole-process [--agent MAPPO] [--steps 100000] [--repeats 3] [--bare-unwrapped]
                                    [--set ...]

Comparison (the default): env-steps/s of training each ``--agent`` in turn on ``--env`` vs "raw", the
vector env the trainer uses (marlkit's adapter, batching, auto-reset) with uniformly random actions at
the same vectorisation, measured alternately in one process so that all see the same machine load; on
mpe_spread also "bare mpe2", a plain loop over one mpe2 env, for reference. Training is the loop
alone (marlkit's own ``perf/env_steps_per_s_overall``); ``--without-overlap`` adds the first agent's
training with ``runner.overlap=false`` to the alternation. Image envs: ``--env benchmarks/envs/
cooperative_pong.yaml`` (or pistonball.yaml, kaz_image.yaml; ``pip install -e .[games]``); run under
``/usr/bin/time -v`` for the peak RSS.

Whole process (``--whole-process``): is ``marlkit`` as a whole process, start-up included, faster than
the bare env stepped with random actions in one process? Alternately for ``--repeats`` pairs, the wall
time of (a) ``python -m marlkit --agent MAPPO --env mpe_spread --logger none --set
runner.total_steps=N ...`` (plus ``--parallels``, ``--vectorize`` and ``--set``) and (b) ``python
benchmarks/throughput.py --bare-loop N``: one mpe2 ``simple_spread_v3.parallel_env(N=3,
max_cycles=25)`` stepped N times with random actions; with ``--bare-unwrapped`` also (c) the same loop
on the env without PettingZoo's order and bounds checking wrappers, as marlkit steps it
(``env.strip_checks``), to show how much of the ratio that accounts for. N is ``--steps`` rounded
up to whole rollouts (marlkit trains whole rollouts); env-steps/s = N / wall.

Writes benchmarks/results/throughput_TAG.json (--tag; by default the date and time, never a file the docs quote).
"""
from __future__ import annotations

import math
import sys
import tempfile
import time
from pathlib import Path

import harness


def bare_loop(steps: int, unwrapped: bool = False) -> float:
    """Seconds to step one mpe2 simple_spread_v3 env ``steps`` times with random actions (resetting
    when an episode ends), after building and resetting it. Imports numpy and mpe2 only (and, with
    ``unwrapped``, PettingZoo's conversion, to step the env without its checking wrappers as
    marlkit does, ``env.strip_checks``)."""
    import numpy as np
    from mpe2 import simple_spread_v3
    env = simple_spread_v3.parallel_env(N=3, max_cycles=25)
    if unwrapped:
        from pettingzoo.utils.conversions import aec_to_parallel_wrapper
        env = aec_to_parallel_wrapper(env.unwrapped)
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    start = time.perf_counter()
    for _ in range(steps):
        if not env.agents:
            env.reset()
        env.step({a: int(rng.integers(5)) for a in env.agents})
    return time.perf_counter() - start


def compare(args, runner: dict) -> None:
    from marlkit.api import build_config
    cfg = build_config(args.agent[0], args.env, overrides=args.overrides, **runner)
    trains = {agent: ("train" if i == 0 else f"train_{agent}") for i, agent in enumerate(args.agent)}
    sides = {"bare_mpe2": lambda: args.steps // 4 / bare_loop(args.steps // 4)} if args.env == "mpe_spread" else {}
    sides["raw"] = lambda: harness.random_steps_per_s(cfg, args.steps)
    for agent, key in trains.items():
        sides[key] = lambda agent=agent: harness.train_steps_per_s(agent, args.env, args.steps,
                                                                   {**args.overrides, **runner})
    if args.without_overlap:
        sides["train_no_overlap"] = lambda: harness.train_steps_per_s(
            args.agent[0], args.env, args.steps, {**args.overrides, **runner, "runner.overlap": False})
    samples, med = harness.measure(sides, args.repeats)
    harness.write_results("throughput", args, {
        "env": args.env, "agent": args.agent[0] if len(args.agent) == 1 else args.agent,
        "parallels": cfg.runner.parallels, "vectorize": cfg.runner.vectorize, "overlap": cfg.runner.overlapped(),
        "overrides": args.set,
        "steps_per_measurement": args.steps, "repeats": args.repeats, "samples": samples,
        "median_env_steps_per_s": med, "train_over_raw": med["train"] / med["raw"],
        **({"over_first_agent": {a: med[k] / med["train"] for a, k in trains.items()}} if len(trains) > 1 else {}),
        **({"overlap_over_no_overlap": med["train"] / med["train_no_overlap"]} if args.without_overlap else {})})
    vec = f"x{cfg.runner.parallels} ({cfg.runner.vectorize}{', overlap' if cfg.runner.overlapped() else ''})"
    rows = [["bare mpe2, 1 env, random", med["bare_mpe2"], None]] if "bare_mpe2" in med else []
    rows.append([f"raw vector env {vec}, random", med["raw"], None])
    rows += [[f"{agent} training {vec}", med[key], med[key] / med["raw"]] for agent, key in trains.items()]
    if args.without_overlap:
        rows.append([f"{args.agent[0]} training, runner.overlap=false", med["train_no_overlap"],
                     med["train_no_overlap"] / med["raw"]])
    harness.table(["workload", "env-steps/s (median)", "training / raw"], rows)
    for agent, key in list(trains.items())[1:]:
        print(f"{agent} / {args.agent[0]} training = {med[key] / med['train']:.2f}")


def whole_process(args, runner: dict) -> None:
    if args.env != "mpe_spread":
        sys.exit("--whole-process compares against a bare mpe2 simple_spread loop: --env must be mpe_spread")
    from marlkit.api import build_config
    cfg = build_config(args.agent[0], "mpe_spread", overrides=args.overrides, **runner)
    per_rollout = cfg.runner.parallels * cfg.runner.horizon
    n = math.ceil(args.steps / per_rollout) * per_rollout
    if n != args.steps:
        print(f"--steps {args.steps} rounded up to {n}, whole rollouts of {per_rollout} env steps", flush=True)
    with tempfile.TemporaryDirectory() as root:
        commands = {
            "marlkit": [sys.executable, "-m", "marlkit", "--agent", args.agent[0], "--env", "mpe_spread",
                        "--logger", "none", "--set", f"runner.total_steps={n}", "runner.progress=false",
                        f"runner.run_root={root}", f"runner.save_interval={10 ** 9}",
                        *(f"{k}={v}" for k, v in runner.items()), *args.set],
            "bare": [sys.executable, str(Path(__file__).resolve()), "--bare-loop", str(n)]}
        if args.bare_unwrapped:
            commands["bare_unwrapped"] = commands["bare"] + ["--unwrapped"]
        wall, med = harness.measure({side: lambda cmd=cmd: harness.time_process(cmd) for side, cmd in commands.items()},
                                    args.repeats)
    rates = {side: [n / s for s in walls] for side, walls in wall.items()}
    med_rate = {side: harness.median(r) for side, r in rates.items()}
    harness.write_results("throughput", args, {
        "mode": "whole_process", "env_steps": n, "repeats": args.repeats, "overrides": args.set,
        "parallels": cfg.runner.parallels, "vectorize": cfg.runner.vectorize, "overlap": cfg.runner.overlapped(),
        "commands": {side: " ".join(cmd).replace(root, "<tmp>").replace(sys.executable, "python")
                     .replace(f"{Path(__file__).resolve().parent.parent}/", "") for side, cmd in commands.items()},
        "wall_s": wall, "median_wall_s": med, "env_steps_per_s": rates, "median_env_steps_per_s": med_rate,
        "marlkit_over_bare": med_rate["marlkit"] / med_rate["bare"],
        **({"marlkit_over_bare_unwrapped": med_rate["marlkit"] / med_rate["bare_unwrapped"]}
           if args.bare_unwrapped else {})})
    harness.table(["whole process", "wall s (median)", "env-steps/s (median)"],
                  [[f"marlkit {args.agent[0]} training x{cfg.runner.parallels} ({cfg.runner.vectorize})", med["marlkit"],
                    med_rate["marlkit"]],
                   ["bare mpe2 loop, 1 env, random", med["bare"], med_rate["bare"]]]
                  + ([["the same, without the checking wrappers", med["bare_unwrapped"], med_rate["bare_unwrapped"]]]
                     if args.bare_unwrapped else []))
    print(f"marlkit / bare = {med_rate['marlkit'] / med_rate['bare']:.2f} ({n} env steps each)")
    if args.bare_unwrapped:
        print(f"marlkit / bare without the checking wrappers = "
              f"{med_rate['marlkit'] / med_rate['bare_unwrapped']:.2f}")


def main() -> None:
    p = harness.parser(__doc__)
    p.add_argument("--env", default="mpe_spread", help="packaged env name or env YAML path")
    p.add_argument("--agent", nargs="+", default=["MAPPO"], help="one or more agents, trained in turn each repeat")
    p.add_argument("--steps", type=int, default=100_000, help="env steps per measurement")
    p.add_argument("--parallels", type=int, help="runner.parallels (default: the env's config)")
    p.add_argument("--vectorize", choices=["sync", "subprocess", "auto", "ray"],
                   help="runner.vectorize (default: the env's config)")
    p.add_argument("--without-overlap", action="store_true",
                   help="also train the first agent with runner.overlap=false, alternating with the rest")
    p.add_argument("--whole-process", action="store_true", help="time whole processes: marlkit vs a bare loop")
    p.add_argument("--bare-unwrapped", action="store_true",
                   help="--whole-process: also time the bare loop without PettingZoo's checking wrappers")
    p.add_argument("--bare-loop", type=int, metavar="N", help="(the bare side of --whole-process) step N times, exit")
    p.add_argument("--unwrapped", action="store_true", help="(with --bare-loop) without the checking wrappers")
    args = p.parse_args() if "--bare-loop" in sys.argv else harness.parse_args(p)
    if args.bare_loop is not None:
        bare_loop(args.bare_loop, args.unwrapped)
        return
    import torch
    torch.set_num_threads(1)
    runner = {k: v for k, v in (("runner.parallels", args.parallels), ("runner.vectorize", args.vectorize))
              if v is not None}
    (whole_process if args.whole_process else compare)(args, runner)


if __name__ == "__main__":
    main()

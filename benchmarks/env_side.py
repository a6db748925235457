"""The env side alone: CPU seconds per 10,000 env steps of uniformly random actions through marlkit's
vector env (adapter, batching, auto-reset; no agent learns), for packaged envs, in this checkout
against another (``--against``), the two taking turns as whole processes.

    python benchmarks/env_side.py [--envs mettagrid lbf_8x8_2p_2f_coop rware_tiny_2ag] [--steps 40000]
                                  [--against OTHER_CHECKOUT] [--dicts] [--repeats 3] [--tag NAME]

``--dicts`` adds, for envs in arrays (``ArrayParallelEnv``: mettagrid), the same env read through
its per-agent dicts, as any ParallelEnv is read (:func:`dicts_of` hides its array form), so that
the array path is measured against the dict path in this very checkout.

    python benchmarks/env_side.py --gymma-adapter [--repeats 7] [--tag NAME]

The gymma adapter's own cost per step, the env taken away: a gymnasium env of 2, 4, 8 and 16 alike
agents that returns the same arrays every step, read as arrays and agent by agent (the adapter's
path for agents whose spaces differ), alternating in one process, best of ``--repeats``.

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


def dicts_of(inner: str, **kwargs):
    """``env.factory`` for ``--dicts``: ``inner``'s env behind its dict API alone."""
    from marlkit.envs.array_env import DictsOnly
    from marlkit.envs.pettingzoo import import_factory
    return DictsOnly(import_factory(inner)(**kwargs))


def side(checkout: Path, env: str, steps: int, dicts: bool = False) -> dict:
    """CPU and wall seconds per 10,000 env steps of ``env`` with ``checkout``'s marlkit (``dicts``:
    through its per-agent dicts)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    sys.path.insert(0, str(checkout))
    import torch
    torch.set_num_threads(1)
    import marlkit
    assert Path(marlkit.__file__).resolve().is_relative_to(checkout), marlkit.__file__
    cfg = marlkit.build_config(agent="MAPPO", env=env, **{"runner.vectorize": "sync"})
    if dicts:
        cfg.env.kwargs = {**cfg.env.kwargs, "inner": cfg.env.factory}
        cfg.env.factory = "env_side:dicts_of"
    stats: dict = {}
    cpu = time.process_time()
    harness.random_steps_per_s(cfg, steps, stats=stats)
    cpu = time.process_time() - cpu
    per = 10_000 / stats["env_steps"]
    return {"cpu_s_per_10k": cpu * per, "wall_s_per_10k": stats["seconds"] * per,
            "env_steps_per_s": stats["env_steps"] / stats["seconds"], "envs": cfg.runner.parallels}


def gymma_adapter(repeats: int, steps: int = 5000) -> dict:
    """Microseconds per step of the gymma adapter alone, as arrays and agent by agent, per agent count."""
    import gymnasium
    import numpy as np
    from gymnasium import spaces
    from marlkit.envs.gymma import GymmaEnv

    class Still(gymnasium.Env):
        def __init__(self, n: int):
            self.observation_space = spaces.Tuple([spaces.Box(-1, 1, (71,), np.float32)] * n)   # rware's size
            self.action_space = spaces.Tuple([spaces.Discrete(5)] * n)
            self.obs, self.rewards = tuple(np.zeros(71, np.float32) for _ in range(n)), [0.0] * n

        def reset(self, seed=None, options=None):
            return self.obs, {}

        def step(self, actions):
            return self.obs, self.rewards, False, False, {}

    out = {}
    for n in (2, 4, 8, 16):
        env = GymmaEnv(Still(n))
        env.reset()
        actions = {"agents": np.zeros(n, np.int64)}
        best = {"arrays": float("inf"), "per_agent": float("inf")}
        for _ in range(repeats):
            for form in best:
                env._alike = form == "arrays"
                start = time.perf_counter()
                for _ in range(steps):
                    env.step(actions)
                best[form] = min(best[form], (time.perf_counter() - start) / steps * 1e6)
        out[n] = {**{f"{k}_us_per_step": v for k, v in best.items()}, "ratio": best["arrays"] / best["per_agent"]}
    return out


def run_side(checkout: Path, env: str, steps: int, dicts: bool = False) -> dict:
    done = subprocess.run([sys.executable, __file__, "--side", str(checkout), env, str(steps)] + ["dicts"] * dicts,
                          capture_output=True, text=True, cwd=HERE)
    if done.returncode != 0:
        raise RuntimeError(f"{checkout} on {env} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    if sys.argv[1:2] == ["--side"]:
        print(json.dumps(side(Path(sys.argv[2]).resolve(), sys.argv[3], int(sys.argv[4]), sys.argv[5:] == ["dicts"])))
        return
    p = harness.parser(__doc__, overrides=False)
    p.add_argument("--envs", nargs="+", default=["mettagrid", "lbf_8x8_2p_2f_coop", "rware_tiny_2ag"])
    p.add_argument("--steps", type=int, default=40_000, help="env steps per measurement")
    p.add_argument("--against", type=Path, default=None, help="another checkout of marlkit to compare with")
    p.add_argument("--dicts", action="store_true", help="also this checkout through the env's dicts (envs in arrays)")
    p.add_argument("--gymma-adapter", action="store_true", help="the gymma adapter's own cost, arrays against per agent")
    args = harness.parse_args(p)
    if args.gymma_adapter:
        costs = gymma_adapter(args.repeats)
        harness.table(["agents", "us / step, arrays", "us / step, per agent", "arrays / per agent"],
                      [[n, c["arrays_us_per_step"], c["per_agent_us_per_step"], f"{c['ratio']:.2f}x"] for n, c in costs.items()])
        harness.write_results("env_side", args, {"gymma_adapter": costs})
        return
    if not args.against and not args.dicts:
        p.error("nothing to compare with: give --against, --dicts or both")
    results, rows = {}, []
    for env in args.envs:
        sides = {"this": lambda: run_side(HERE, env, args.steps)}
        if args.dicts:
            sides["dicts"] = lambda: run_side(HERE, env, args.steps, dicts=True)
        if args.against:
            sides["against"] = lambda: run_side(args.against.resolve(), env, args.steps)
        samples, medians = harness.measure(sides, args.repeats, f"{env}: ")
        results[env] = {"samples": samples, "medians": medians, "ratios": {}}
        for other in sides.keys() - {"this"}:
            for unit in ("cpu_s_per_10k", "wall_s_per_10k"):
                # per alternating pair, then the median: the pair shared the machine's load
                pairs = [t[unit] / o[unit] for t, o in zip(samples["this"], samples[other])]
                results[env]["ratios"][f"this / {other}, {unit}"] = {"median": harness.median(pairs),
                                                                     "min": min(pairs), "max": max(pairs)}
            rows.append([env, other] + [f"{medians[n]['wall_s_per_10k']:.2f}" for n in ("this", other)]
                        + [f"{results[env]['ratios'][f'this / {other}, {u}']['median']:.2f}x"
                           for u in ("wall_s_per_10k", "cpu_s_per_10k")])
    harness.table(["env", "against", "wall s / 10k, this", "wall s / 10k, other", "wall ratio", "CPU ratio"], rows)
    harness.write_results("env_side", args, {"this": str(HERE), "against": str(args.against) if args.against else None,
                                             "steps": args.steps, "envs": results})


if __name__ == "__main__":
    main()

"""The FLOP budget of image workloads: MFLOP per agent step when acting and per sample in the update,
the GFLOP/s the update achieves, and that as a fraction of this machine's measured peak.

Workloads are the update of MAPPO with a ``cnn`` actor on synthetic rollouts shaped like real envs
(no env is started, so it runs anywhere torch does, GPUs included):

- ``battle_cnn``: MAgent2 battle 12 v 12 (13x13x5 views, 21 actions), one group of 12, 8 envs x 25
  steps, the packaged defaults otherwise (a pooled critic on the actor's encoder);
- ``pong_cnn``: cooperative_pong as packaged (screens shrunk to 56x60x3), 2 paddles, 8 envs x 25;
- ``doom_coop``: as packaged: the actor over 4 stacked 30x80 grey screens (channels 16-32-32), the
  critic an MLP of 128-128 over the 17 game variables of ``env.state: variables`` with the
  player's id, 2 players, 4 matches x 128 steps, 3 epochs of 2 minibatches.

The peak is what torch itself reaches on this machine: a large convolution and a large matmul, on
one thread and on every thread given (``--threads``), or on the GPU.

    python benchmarks/update_flops.py                       # CPU, 1 and 2 threads
    python benchmarks/update_flops.py --precision float32 bfloat16   # and the update in bfloat16
    python benchmarks/update_flops.py --device cuda --out benchmarks/results/update_flops_cuda.json
    python benchmarks/update_flops.py --device cuda --scale 1 4 16   # rollouts 4x and 16x as large
"""
from __future__ import annotations

import argparse
import copy
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from gymnasium import spaces
from torch.utils.flop_counter import FlopCounterMode

from marlkit.agents.base import Progress
from marlkit.api import build_config
from marlkit.config import ModelConfig
from marlkit.precision import loss_precision
from marlkit.registry import get_agent
from marlkit.spec import EnvSpec, GroupSpec
from marlkit.storage import Bootstrap, Collected, StorageLayout, Transition

WORKLOADS = {
    # name: (agents, obs shape, obs dtype, actions, envs, horizon, state size (None: the
    # observations, read by a pooled critic), actor, overrides)
    "battle_cnn": (12, (13, 13, 5), np.float32, 21, 8, 25, None, {"name": "cnn"}, {}),
    "pong_cnn": (2, (56, 60, 3), np.uint8, 3, 8, 25, None, {"name": "cnn"}, {}),
    "doom_coop": (2, (4, 30, 80), np.uint8, 6, 4, 128, 17,
                  {"name": "cnn", "hidden_sizes": [256], "kwargs": {"channels": [16, 32, 32]}},
                  {"epochs": 3, "minibatches": 2, "use_agent_id": True,
                   "critic": ModelConfig(name="mlp", hidden_sizes=[128, 128])}),
}


def peak_gflops(device: torch.device, threads: int, precision: str = "float32", repeats: int = 5) -> dict[str, float]:
    """What torch reaches here on a large convolution and a large matmul (GFLOP/s), in float32 or
    under bfloat16 autocast as the agents' ``precision: bfloat16`` runs them."""
    with loss_precision(device, precision):
        return _peak_gflops(device, threads, repeats)


def _peak_gflops(device: torch.device, threads: int, repeats: int) -> dict[str, float]:
    torch.set_num_threads(threads)
    x = torch.randn(256, 32, 32, 32, device=device)
    conv = torch.nn.Conv2d(32, 64, 3).to(device)
    # the convolution in both memory layouts, the faster one counted (marlkit's cnn runs channels-last)
    x_last, conv_last = x.contiguous(memory_format=torch.channels_last), copy.deepcopy(conv).to(
        memory_format=torch.channels_last)
    a, b = torch.randn(2048, 2048, device=device), torch.randn(2048, 2048, device=device)
    out = {}
    conv_flops = 2 * 256 * 64 * 30 * 30 * 32 * 9
    for name, fn, flops in (("conv_nchw", lambda: conv(x), conv_flops),
                            ("conv_nhwc", lambda: conv_last(x_last), conv_flops),
                            ("matmul", lambda: a @ b, 2 * 2048 ** 3)):
        fn()
        best = float("inf")
        for _ in range(repeats):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
        out[name] = flops / best / 1e9
    out["conv"] = max(out["conv_nchw"], out["conv_nhwc"])
    return out


def make_agent(name: str, device: torch.device, precision: str = "float32"):
    n_agents, shape, dtype, n_actions, envs, horizon, state_size, actor, overrides = WORKLOADS[name]
    high = 255 if dtype == np.uint8 else 1.0
    group = GroupSpec("agents", [f"agent_{i}" for i in range(n_agents)], spaces.Box(0, high, shape, dtype),
                      spaces.Discrete(n_actions))
    env = (EnvSpec({"agents": group}, (n_agents * int(np.prod(shape)),), state_from_obs=True) if state_size is None
           else EnvSpec({"agents": group}, (state_size,)))
    cfg = build_config("MAPPO", "mpe_spread").agents["MAPPO"]
    cfg = replace(cfg, actor=ModelConfig(**{**ModelConfig().__dict__, **actor}), critic_input="auto",
                  precision=precision, **overrides)
    agent = get_agent("MAPPO")(group, env, cfg, seed=0, device=str(device))
    return agent, group, env, envs, horizon


def acting_inputs(group, env, envs: int, rng):
    """What ``agent.act`` takes for ``envs`` envs of a workload -> (a function drawing random
    observations, the global state, every agent present, every action allowed)."""
    A, shape, dtype = group.n_agents, group.obs_shape, group.observation_space.dtype

    def obs():
        return (rng.integers(0, 256, (envs, A, *shape)).astype(dtype) if dtype == np.uint8
                else rng.random((envs, A, *shape), dtype=np.float32))

    state = (np.zeros((envs, 0), np.float32) if env.state_from_obs
             else rng.normal(size=(envs, *env.state_shape)).astype(np.float32))
    return obs, state, np.ones((envs, A), bool), np.ones((envs, A, group.n_actions), bool)


def rollout(agent, group, env, envs: int, horizon: int, rng):
    """A full rollout of random observations acted on by ``agent`` -> (batch, acting seconds, acting FLOPs)."""
    storage = agent.make_storage(StorageLayout(group, env, envs, horizon))
    r = storage.next_rollout()
    A = group.n_agents
    obs, state, mask, allowed = acting_inputs(group, env, envs, rng)
    acting_s, counter = 0.0, FlopCounterMode(display=False)
    for t in range(horizon):
        o = obs()
        if t == 0:   # counted once (the counter slows what it counts), timed on the other steps
            with counter:
                out = agent.act(o, state, mask, allowed, None)
            act_flops = counter.get_total_flops()
        else:
            start = time.perf_counter()
            out = agent.act(o, state, mask, allowed, None)
            acting_s += time.perf_counter() - start
        r.add(Transition(o, state, mask, allowed, out.actions, out.log_prob, out.value,
                         rng.normal(size=(envs, A)).astype(np.float32), np.zeros((envs, A), bool),
                         np.zeros((envs, A), bool), np.zeros(envs, bool), o, state))
    boot = Bootstrap(obs(), state, mask, allowed, None)
    return storage.finish(Collected(r, boot)), acting_s, act_flops


def measure(name: str, device: torch.device, threads: int, updates: int, precision: str = "float32",
            scale: int = 1) -> dict:
    """One workload's row; ``scale`` multiplies its envs (the minibatch count stays, so each
    minibatch grows): an update whose time does not grow with it is bound by per-minibatch costs
    (kernel launches, Python), not by arithmetic."""
    torch.set_num_threads(threads)
    agent, group, env, envs, horizon = make_agent(name, device, precision)
    envs *= scale
    rng = np.random.default_rng(0)
    batch, acting_s, act_flops = rollout(agent, group, env, envs, horizon, rng)
    agent.update(batch, Progress(envs * horizon, 10 ** 9))   # warm-up: first calls allocate
    with FlopCounterMode(display=False) as counter:
        agent.update(rollout(agent, group, env, envs, horizon, rng)[0], Progress(2, 10 ** 9))
    update_flops = counter.get_total_flops()
    seconds = []
    for _ in range(updates):
        batch = rollout(agent, group, env, envs, horizon, rng)[0]
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        agent.update(batch, Progress(3, 10 ** 9))
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    samples = envs * horizon * group.n_agents            # agent steps in one rollout
    update_s = float(np.median(seconds))
    return {"workload": name, "device": str(device), "threads": threads, "precision": precision, "envs": envs,
            "samples_per_update": samples,
            "acting_mflop_per_agent_step": act_flops / (envs * group.n_agents) / 1e6,
            "update_mflop_per_sample": update_flops / samples / 1e6,
            "update_gflop": update_flops / 1e9, "update_s_median": update_s,
            "update_gflops_per_s": update_flops / update_s / 1e9,
            "acting_ms_per_step": 1e3 * acting_s / (horizon - 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS))
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--precision", nargs="*", default=["float32"], choices=["float32", "bfloat16"],
                        help="the update's precision (the agents' precision key); FLOPs are counted alike")
    parser.add_argument("--scale", type=int, nargs="*", default=[1],
                        help="rollouts of this many times each workload's envs (same minibatch count)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = torch.device(args.device)
    rows, peaks = [], {}
    for threads in args.threads:
        for precision in args.precision:
            peak = peaks.setdefault(threads, {})[precision] = peak_gflops(device, threads, precision)
            print(f"peak on {device}, {threads} thread(s), {precision}: conv {peak['conv']:.1f} GFLOP/s, "
                  f"matmul {peak['matmul']:.1f} GFLOP/s")
        for name, precision, scale in ((n, p, k) for n in args.workloads for p in args.precision for k in args.scale):
            row = measure(name, device, threads, args.updates, precision, scale)
            row["fraction_of_conv_peak"] = row["update_gflops_per_s"] / peaks[threads][precision]["conv"]
            row["fraction_of_matmul_peak"] = row["update_gflops_per_s"] / peaks[threads][precision]["matmul"]
            rows.append(row)
            print(f"  {name:<11} {precision:<8} {row['samples_per_update']:>6} samples: "
                  f"acting {row['acting_mflop_per_agent_step']:.2f} MFLOP/agent step "
                  f"({row['acting_ms_per_step']:.1f} ms/step); "
                  f"update {row['update_mflop_per_sample']:.1f} MFLOP/sample, "
                  f"{row['update_gflop']:.1f} GFLOP in {row['update_s_median']:.3f} s = "
                  f"{row['update_gflops_per_s']:.1f} GFLOP/s, {100 * row['fraction_of_conv_peak']:.0f}% of the conv "
                  f"peak, {100 * row['fraction_of_matmul_peak']:.0f}% of the matmul peak (both in its precision)")
    if args.out:
        args.out.write_text(json.dumps({"device": str(device), "torch": torch.__version__,
                                        "cpu_threads": args.threads, "peaks": peaks, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()

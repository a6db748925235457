"""MAT's acting cost per vector step as the group grows, beside MAPPO's, both batched over envs.

    python benchmarks/mat_acting.py [--agents 3 8 24] [--envs 16] [--calls 200] [--repeats 3]

MAT decodes agent by agent (a Python loop over agents, each iteration one decoder position for
all envs at once); MAPPO samples all agents in one pass. For each group size, a synthetic group
(18-dim observations, Discrete(5), every agent present, all actions allowed) is acted on with the
packaged mpe_spread settings of each agent, the two agents taking turns in blocks of ``--calls``
calls so that both see the same machine load. Writes benchmarks/results/mat_acting.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from gymnasium import spaces

from marlkit.api import build_config
from marlkit.registry import get_agent
from marlkit.spec import GroupSpec

OBS_DIM, N_ACTIONS = 18, 5


def make(name: str, n_agents: int, num_envs: int):
    group = GroupSpec("agents", [f"agent_{i}" for i in range(n_agents)],
                      spaces.Box(-1, 1, (OBS_DIM,), np.float32), spaces.Discrete(N_ACTIONS))
    cfg = build_config(name, "mpe_spread").agents[name]
    return get_agent(name)(group, (OBS_DIM * n_agents,), cfg, num_envs, 25, seed=0)


def ms_per_call(agent, num_envs: int, calls: int) -> float:
    A = agent.n_agents
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(num_envs, A, OBS_DIM)).astype(np.float32)
    state = obs.reshape(num_envs, -1)
    present, allowed = np.ones((num_envs, A), bool), np.ones((num_envs, A, N_ACTIONS), bool)
    for _ in range(10):
        agent.act(obs, state, present, allowed, None)
    start = time.perf_counter()
    for _ in range(calls):
        agent.act(obs, state, present, allowed, None)
    return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", nargs="+", type=int, default=[3, 8, 24])
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = {}
    for n in args.agents:
        agents = {name: make(name, n, args.envs) for name in ("MAT", "MAPPO")}
        samples = {name: [] for name in agents}
        for _ in range(args.repeats):
            for name, agent in agents.items():
                samples[name].append(ms_per_call(agent, args.envs, args.calls))
        med = {name: statistics.median(v) for name, v in samples.items()}
        rows[str(n)] = {"samples_ms_per_call": samples, "median_ms_per_call": med,
                        "mat_ms_per_agent": med["MAT"] / n, "mat_over_mappo": med["MAT"] / med["MAPPO"]}
        print(f"{n:>3} agents: MAT {med['MAT']:.2f} ms/call ({med['MAT'] / n:.2f} per agent), "
              f"MAPPO {med['MAPPO']:.2f} ms/call, MAT / MAPPO {med['MAT'] / med['MAPPO']:.1f}", flush=True)
    out = Path(__file__).parent / "results" / "mat_acting.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"envs": args.envs, "calls": args.calls, "repeats": args.repeats,
                               "obs_dim": OBS_DIM, "n_actions": N_ACTIONS, "rows": rows,
                               "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores, "
                                          f"{platform.python_version()}", "torch": torch.__version__}, indent=2))
    print(f"written {out}")


if __name__ == "__main__":
    main()

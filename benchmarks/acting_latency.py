"""How long one acting pass takes back to back, as a microbenchmark times it, against after the core
ran something else for a while, as in training, where the envs run between two passes.

The agent is MAPPO on a workload of ``update_flops.py`` (doom_coop's actor over 4 stacked 30x80
screens by default), acting on one thread on a fixed batch of observations. Each gap is spent
spinning on the same thread (so the core never idles) before every timed pass; ``--doom`` also
times the pass between the steps of doom_coop's real vector env (4 matches of 2 players, random
observations replaced by the matches' own). A pass slower after a gap than back to back pays for
what the gap's work pushed out of the core's caches and predictors, and training pays the slower
figure every step.

    python benchmarks/acting_latency.py [--workloads doom_coop battle_cnn] [--gaps 0 0.3 1 3 8] [--doom]
"""
from __future__ import annotations

import time

import numpy as np

import harness
from update_flops import WORKLOADS, acting_inputs, make_agent


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def after_gaps(name: str, gaps_ms: list[float], calls: int) -> dict[str, float]:
    """ms per acting pass of ``name``'s agent after each gap (0: back to back)."""
    import torch
    agent, group, env, envs, _ = make_agent(name, torch.device("cpu"))
    draw, state, mask, allowed = acting_inputs(group, env, envs, np.random.default_rng(0))
    obs = draw()
    for _ in range(20):
        agent.act(obs, state, mask, allowed, None)
    out = {}
    for gap in gaps_ms:
        total = 0.0
        for _ in range(calls):
            spin(gap / 1e3)
            start = time.perf_counter()
            agent.act(obs, state, mask, allowed, None)
            total += time.perf_counter() - start
        out[f"gap_{gap:g}_ms"] = 1e3 * total / calls
    return out


def between_doom_steps(calls: int) -> dict[str, float]:
    """ms per acting pass of doom_coop's packaged MAPPO agent back to back on one observation of its
    vector env, and between that env's steps (acting on each step's observation)."""
    from marlkit.api import build_config
    from marlkit.envs.factory import make_env_vector
    from marlkit.registry import get_agent
    cfg = build_config("MAPPO", "doom_coop")
    venv = make_env_vector(cfg.env, cfg.runner)
    try:
        (g, group), = venv.spec.groups.items()
        agent = get_agent("MAPPO")(group, venv.spec, cfg.agents["MAPPO"], seed=0, device="cpu")
        obs = venv.reset(seed=0)

        def act(o):
            return agent.act(o.obs[g], o.state, o.agent_mask[g], o.action_mask[g], None)

        for _ in range(20):
            act(obs)
        start = time.perf_counter()
        for _ in range(calls):
            act(obs)
        back_to_back = (time.perf_counter() - start) / calls
        acting = stepping = 0.0
        for _ in range(calls):
            start = time.perf_counter()
            out = act(obs)
            acting += time.perf_counter() - start
            start = time.perf_counter()
            obs = venv.step({g: out.actions}).next
            stepping += time.perf_counter() - start
        return {"back_to_back_ms": 1e3 * back_to_back, "between_steps_ms": 1e3 * acting / calls,
                "step_ms": 1e3 * stepping / calls}
    finally:
        venv.close()


def main() -> None:
    p = harness.parser(__doc__, overrides=False)
    p.add_argument("--workloads", nargs="*", default=["doom_coop"], choices=list(WORKLOADS))
    p.add_argument("--gaps", nargs="*", type=float, default=[0, 0.3, 1, 3, 8], help="ms spun before each pass")
    p.add_argument("--calls", type=int, default=200, help="timed passes per figure")
    p.add_argument("--doom", action="store_true", help="also act between the steps of doom_coop's vector env")
    args = harness.parse_args(p)
    import torch
    torch.set_num_threads(1)   # acting's count in training (runner.torch_threads)
    sides = {name: (lambda name=name: after_gaps(name, args.gaps, args.calls)) for name in args.workloads}
    if args.doom:
        sides["doom_coop_env"] = lambda: between_doom_steps(args.calls)
    samples, medians = harness.measure(sides, args.repeats)
    harness.write_results("acting_latency", args, {"calls": args.calls, "gaps_ms": args.gaps, "samples": samples,
                                                  "medians": medians})
    rows = [[name, *(f"{medians[name][f'gap_{g:g}_ms']:.2f}" for g in args.gaps)] for name in args.workloads]
    harness.table(["ms per acting pass (median), after a gap of", *(f"{g:g} ms" for g in args.gaps)], rows)
    if args.doom:
        d = medians["doom_coop_env"]
        print(f"doom_coop's vector env: acting {d['back_to_back_ms']:.2f} ms back to back, "
              f"{d['between_steps_ms']:.2f} ms between steps ({d['between_steps_ms'] / d['back_to_back_ms']:.2f}x); "
              f"a step {d['step_ms']:.2f} ms")


if __name__ == "__main__":
    main()

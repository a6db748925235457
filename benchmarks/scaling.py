"""How cost grows with the number of agents: a synthetic grid battle of N agents in two groups
(``red_*``, ``blue_*``) with 13x13x5 uint8 image observations and agents that die, for several N.

    python benchmarks/scaling.py [--agents 4 12 24 48] [--steps 20000] [--parallels 16]
                                 [--critics pooled own shared detached state every_slot] [--profile-steps 5000]
                                 [--set agents.MAPPO.epochs=5 ...] [--tag NAME]

For every N, measured alternately in one process: env-steps/s and agent-steps/s (agents acting,
the dead ones not counted) of raw stepping (the bare ParallelEnv, and marlkit's vector env with
random actions) and of MAPPO training with the default config, once per critic of ``--critics``
(``agents.MAPPO.critic_input`` and ``critic_encoder``: the env has no ``state()``, so ``pooled``,
the default, pools the agents' views through the actor's encoder, one pass serving both, with a
tenth of the value gradient sent into it; ``own`` pools them each through the critic's own
encoder; ``shared`` and ``detached`` are ``pooled`` with all of the value gradient sent into the
actor's encoder, and none (``critic_encoder_grad`` 1 and 0); ``state`` reads the default global
state, the views stacked; ``every_slot``: the state critic with every agent slot, dead or alive, through the
networks, as training ran before it skipped absent slots: the baseline the others are held to),
then a cProfile of a short training run with the first critic: its top entries by own time,
and per critic the compute ceiling: the matrix arithmetic of a short training run (torch's
FlopCounterMode: matmuls and convolutions, forward and backward) per agent step, against this
machine's best matmul rate on all its cores, gives the most agent-steps/s any implementation of
that update could reach here. Writes benchmarks/results/scaling[_NAME].json.

The env is ``benchmarks/grid_battle.py``: cheap per agent and linear in N.
"""
from __future__ import annotations

import cProfile
import os
import pstats
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

import harness
from grid_battle import CHANNELS, VIEW, GridBattleEnv, make_env  # noqa: F401  (make_env: tests import it here)

ENV_FACTORY = "grid_battle:make_env"   # this file's folder is on sys.path when it runs as a script


def env_yaml(folder: Path, n_agents: int) -> str:
    import yaml
    path = folder / f"grid_battle_{n_agents}.yaml"
    path.write_text(yaml.safe_dump({
        "description": f"synthetic grid battle, {n_agents} agents, 13x13x5 views",
        "env": {"type": "pettingzoo", "factory": ENV_FACTORY, "kwargs": {"n_agents": n_agents},
                "groups": {"red": ["red_*"], "blue": ["blue_*"]},
                # the space check runs in each env's first episode only; left out so that short
                # measurements show the steady state
                "check_api": False}}))
    return str(path)


class AgentStepCounter:
    """Counts the agents acting in every step of every ``GridBattleEnv`` of this process."""

    def __init__(self):
        self.count = 0
        self._step = GridBattleEnv.step

    def __enter__(self):
        counter = self

        def step(env, actions):
            counter.count += len(env.agents)
            return counter._step(env, actions)

        GridBattleEnv.step = step
        return self

    def __exit__(self, *exc):
        GridBattleEnv.step = self._step


def bare_env(n_agents: int, steps: int) -> dict:
    env = make_env(n_agents)
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    with AgentStepCounter() as counter:
        start = time.perf_counter()
        for _ in range(steps):
            if not env.agents:
                env.reset()
            env.step({a: int(rng.integers(6)) for a in env.agents})
        elapsed = time.perf_counter() - start
    return {"env_steps_per_s": steps / elapsed, "agent_steps_per_s": counter.count / elapsed,
            "agents_acting_per_step": counter.count / steps}


def vector_env(cfg, steps: int) -> dict:
    stats: dict = {}
    with AgentStepCounter() as counter:
        rate = harness.random_steps_per_s(cfg, steps, stats=stats)
    return {"env_steps_per_s": rate, "agent_steps_per_s": counter.count / stats["seconds"]}


CRITICS = {   # --critics -> MAPPO's critic settings
    "pooled": {"critic_input": "pooled"},
    "own": {"critic_input": "pooled", "critic_encoder": "own"},
    "shared": {"critic_input": "pooled", "critic_encoder": "actor", "critic_encoder_grad": 1.0},
    "detached": {"critic_input": "pooled", "critic_encoder": "actor", "critic_encoder_grad": 0.0},
    "state": {"critic_input": "state", "critic_encoder": "own"},
    "every_slot": {"critic_input": "state", "critic_encoder": "own"}}


@contextmanager
def every_slot(on: bool):
    """MAPPO's encoders read absent agent slots too (the present mask is dropped), while ``on``."""
    from marlkit.agents.mappo import MAPPO
    encode = MAPPO.encode_agents
    if on:
        MAPPO.encode_agents = lambda self, *args, present=None, **kw: encode(self, *args, **kw)
    try:
        yield
    finally:
        MAPPO.encode_agents = encode


def train(yaml_path: str, critic: str, overrides: dict, steps: int, profile: cProfile.Profile | None = None) -> dict:
    """MAPPO with ``critic`` (a ``--critics`` choice) for ``steps`` env steps."""
    overrides = {**overrides, **{f"agents.MAPPO.{k}": v for k, v in CRITICS[critic].items()}}
    with AgentStepCounter() as counter, every_slot(critic == "every_slot"):
        if profile is not None:
            profile.enable()
        result = harness.train("MAPPO", yaml_path, steps, overrides)
        if profile is not None:
            profile.disable()
    # the training loop's own time: building agents and envs is left out
    rate = result.metrics["perf/env_steps_per_s_overall"]
    seconds = result.steps / rate
    return {"env_steps_per_s": rate, "agent_steps_per_s": counter.count / seconds, "seconds": seconds}


def train_flops(yaml_path: str, critic: str, overrides: dict, steps: int) -> tuple[float, float]:
    """Matmul and convolution FLOPs of a training run (acting and updates) -> (per env step, per
    agent acting). The networks skip absent slots (but for ``every_slot``), so the count follows
    how many agents are alive: both are divided by the steps of this run itself, whose early
    episodes keep more agents alive than the average of a longer one."""
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as counter:
        run = train(yaml_path, critic, overrides, steps)
    flops = counter.get_total_flops()
    return flops / (run["env_steps_per_s"] * run["seconds"]), flops / (run["agent_steps_per_s"] * run["seconds"])


def matmul_peak() -> float:
    """The best FLOP/s of a square float32 matmul on all cores, over sizes 256-2048."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    best = 0.0
    try:
        for n in (256, 512, 1024, 2048):
            a, b = torch.randn(n, n), torch.randn(n, n)
            a @ b
            start, k = time.perf_counter(), 0
            while time.perf_counter() - start < 1.0:
                a @ b
                k += 1
            best = max(best, 2 * n ** 3 * k / (time.perf_counter() - start))
    finally:
        torch.set_num_threads(threads)
    return best


def top_entries(profile: cProfile.Profile, n: int = 12) -> list[dict]:
    stats = pstats.Stats(profile)
    total = stats.total_tt
    rows = []
    for (file, line, name), (_, calls, tottime, cumtime, _) in stats.stats.items():
        where = f"{Path(file).name}:{line}({name})" if line else name
        rows.append({"function": where, "calls": calls, "tottime_s": tottime, "cumtime_s": cumtime,
                     "share": tottime / total})
    rows.sort(key=lambda r: -r["tottime_s"])
    return rows[:n]


def main() -> None:
    p = harness.parser(__doc__, repeats=2)
    p.add_argument("--agents", nargs="+", type=int, default=[4, 12, 24, 48], help="values of N")
    p.add_argument("--steps", type=int, default=20_000, help="env steps per measurement")
    p.add_argument("--parallels", type=int, default=16)
    p.add_argument("--critics", nargs="+", default=["pooled", "state", "every_slot"], choices=list(CRITICS),
                   help="MAPPO critic inputs to train with (every_slot: state, absent slots not skipped)")
    p.add_argument("--profile-steps", type=int, default=5_000)
    args = harness.parse_args(p)

    import torch

    from marlkit.api import build_config

    torch.set_num_threads(1)
    overrides = {**args.overrides, "runner.parallels": args.parallels}
    report = {"parallels": args.parallels, "steps_per_measurement": args.steps, "repeats": args.repeats,
              "critics": args.critics, "overrides": args.set, "observation": [VIEW, VIEW, CHANNELS],
              "matmul_peak_flops": matmul_peak(), "rows": []}
    print(f"matmul peak on {os.cpu_count()} cores: {report['matmul_peak_flops'] / 1e9:.0f} GFLOP/s", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        for n in args.agents:
            path = env_yaml(Path(folder), n)
            cfg = build_config("MAPPO", path, **overrides)
            sides = {"bare": lambda: bare_env(n, max(1, args.steps // 4)),
                     "vector": lambda: vector_env(cfg, args.steps),
                     **{f"train_{c}": lambda c=c: train(path, c, overrides, args.steps) for c in args.critics}}
            samples, med = harness.measure(sides, args.repeats, label=f"N={n}: ")
            profile = cProfile.Profile()
            train(path, args.critics[0], overrides, args.profile_steps, profile)
            row = {"n_agents": n, "state_shape": list(cfg_state_shape(cfg)), "samples": samples, "median": med,
                   "agents_acting_per_step": statistics.mean(s["agents_acting_per_step"] for s in samples["bare"]),
                   "critics": {}, "profile_critic": args.critics[0], "profile_top": top_entries(profile)}
            for c in args.critics:
                per_env_step, per_agent_step = train_flops(path, c, overrides, args.profile_steps)
                trained = med[f"train_{c}"]
                row["critics"][c] = {
                    "train_flops_per_env_step": per_env_step, "train_flops_per_agent_step": per_agent_step,
                    # no implementation of this update can train faster here than its arithmetic at peak
                    "ceiling_agent_steps_per_s": report["matmul_peak_flops"] / per_agent_step,
                    "train_over_vector_agent_steps": trained["agent_steps_per_s"] / med["vector"]["agent_steps_per_s"],
                    "train_over_bare_agent_steps": trained["agent_steps_per_s"] / med["bare"]["agent_steps_per_s"]}
            report["rows"].append(row)
            for entry in row["profile_top"][:6]:
                print(f"      {entry['share']:6.1%}  {entry['function']}", flush=True)
            harness.write_results("scaling", args, report)   # after every N, so that a long run keeps what it did
    harness.table(["N", "acting/step", "bare agent-steps/s", "vector", "critic", "train agent-steps/s",
                   "train/vector", "MFLOP/agent step", "ceiling"],
                  [[r["n_agents"], r["agents_acting_per_step"], r["median"]["bare"]["agent_steps_per_s"],
                    r["median"]["vector"]["agent_steps_per_s"], c, r["median"][f"train_{c}"]["agent_steps_per_s"],
                    x["train_over_vector_agent_steps"], x["train_flops_per_agent_step"] / 1e6,
                    x["ceiling_agent_steps_per_s"]] for r in report["rows"] for c, x in r["critics"].items()])


def cfg_state_shape(cfg) -> tuple[int, ...]:
    from marlkit.envs.factory import make_env as make_marlkit_env
    env = make_marlkit_env(cfg.env)
    try:
        return tuple(env.spec.state_shape)
    finally:
        env.close()


if __name__ == "__main__":
    main()

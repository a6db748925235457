"""How cost grows with the number of agents: a synthetic grid battle of N agents in two groups
(``red_*``, ``blue_*``) with 13x13x5 uint8 image observations and agents that die, for several N.

    python benchmarks/scaling.py [--agents 4 12 24 48] [--steps 20000] [--parallels 16]
                                 [--critics pooled state] [--profile-steps 5000]
                                 [--set agents.MAPPO.epochs=5 ...] [--tag NAME]

For every N, measured alternately in one process: env-steps/s and agent-steps/s (agents acting,
the dead ones not counted) of raw stepping (the bare ParallelEnv, and marlkit's vector env with
random actions) and of MAPPO training with the default config, once per critic input of
``--critics`` (``agents.MAPPO.critic_input``: the env has no ``state()``, so ``pooled``, the
default here, pools the agents' views; ``state`` reads the default global state, the views
stacked), then a cProfile of a short training run with the first critic: its top entries by own
time, and per critic the compute ceiling: the matrix arithmetic of a short training run (torch's
FlopCounterMode: matmuls and convolutions, forward and backward) per agent step, against this
machine's best matmul rate on all its cores, gives the most agent-steps/s any implementation of
that update could reach here. Writes benchmarks/results/scaling[_NAME].json.

The env is cheap per agent and linear in N: layer maps are built once per step, every agent's view
is a slice of them, and attacks look up a grid of agent indices.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

VIEW = 13               # side of an agent's square view
CHANNELS = 5            # walls, allies, enemies, ally hp, enemy hp
MOVES = np.array([(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)])   # stay, up, down, left, right; 5 = attack


class GridBattleEnv(ParallelEnv):
    """Two teams of ``n_agents // 2`` on a square grid (about 4 cells per agent). Actions: stay,
    4 moves, attack (1 damage to an enemy in the 8 surrounding cells). An agent starts with
    ``hp`` hit points and terminates when they reach 0; reward +1 per damage dealt, -1 on death.
    The episode ends when a team is wiped out, or is truncated after ``max_cycles`` steps.

    Each agent sees the ``13x13`` square around itself, channels-last: walls, allies, enemies,
    ally hp, enemy hp, as uint8 (255 = present). No ``state()``: the global state is marlkit's
    default for image observations.
    """

    metadata = {"name": "grid_battle_v0", "render_fps": 10}

    def __init__(self, n_agents: int = 12, hp: int = 3, max_cycles: int = 100, render_mode=None):
        if n_agents < 2 or n_agents % 2:
            raise ValueError(f"n_agents={n_agents} must be an even number >= 2 (two equal teams)")
        half = n_agents // 2
        self.possible_agents = [f"red_{i}" for i in range(half)] + [f"blue_{i}" for i in range(half)]
        self.team = {a: int(a.startswith("blue")) for a in self.possible_agents}
        self.index = {a: i for i, a in enumerate(self.possible_agents)}
        self.side = max(8, int(np.ceil(np.sqrt(4 * n_agents))))
        self.hp0, self.max_cycles, self.render_mode = hp, max_cycles, render_mode
        self._obs_space = spaces.Box(0, 255, (VIEW, VIEW, CHANNELS), np.uint8)
        self._act_space = spaces.Discrete(len(MOVES) + 1)

    def observation_space(self, agent):
        return self._obs_space

    def action_space(self, agent):
        return self._act_space

    def reset(self, seed=None, options=None):
        if seed is not None or not hasattr(self, "rng"):
            self.rng = np.random.default_rng(seed)
        n, side = len(self.possible_agents), self.side
        cells = self.rng.choice(side * side, n, replace=False)
        self.pos = np.stack([cells // side, cells % side], 1)
        self.hp = np.full(n, self.hp0, np.int64)
        self.cell = np.full((side, side), -1, np.int64)          # agent index per cell, -1 = empty
        self.cell[self.pos[:, 0], self.pos[:, 1]] = np.arange(n)
        self.t = 0
        self.agents = list(self.possible_agents)
        views = self._views()
        return {a: views[self.team[a]][self._window(a)] for a in self.agents}, {a: {} for a in self.agents}

    def _views(self) -> list[np.ndarray]:
        """Per team, the padded ``[side + 12, side + 12, 5]`` map its agents see through."""
        pad, side = VIEW // 2, self.side
        alive = self.hp > 0
        teams = np.array([self.team[a] for a in self.possible_agents])
        layers = np.zeros((2, side, side), np.uint8)
        hp = np.zeros((2, side, side), np.uint8)
        for k in range(2):
            who = alive & (teams == k)
            layers[k, self.pos[who, 0], self.pos[who, 1]] = 255
            hp[k, self.pos[who, 0], self.pos[who, 1]] = (255 * self.hp[who] // self.hp0).astype(np.uint8)
        views = []
        for k in range(2):
            world = np.zeros((side + 2 * pad, side + 2 * pad, CHANNELS), np.uint8)
            world[..., 0] = 255
            inner = world[pad:pad + side, pad:pad + side]
            inner[..., 0] = 0
            inner[..., 1], inner[..., 2] = layers[k], layers[1 - k]
            inner[..., 3], inner[..., 4] = hp[k], hp[1 - k]
            views.append(world)
        return views

    def _window(self, agent: str):
        y, x = self.pos[self.index[agent]]
        return slice(y, y + VIEW), slice(x, x + VIEW)

    def step(self, actions):
        acting = list(self.agents)
        rewards = {a: 0.0 for a in acting}
        side = self.side
        for a in acting:
            i, act = self.index[a], int(actions[a])
            y, x = self.pos[i]
            if act < len(MOVES):
                ny, nx = y + MOVES[act][0], x + MOVES[act][1]
                if 0 <= ny < side and 0 <= nx < side and self.cell[ny, nx] < 0:
                    self.cell[y, x], self.cell[ny, nx] = -1, i
                    self.pos[i] = (ny, nx)
                continue
            around = self.cell[max(y - 1, 0):y + 2, max(x - 1, 0):x + 2].ravel()
            for j in around[around >= 0]:
                if self.team[self.possible_agents[j]] != self.team[a] and self.hp[j] > 0:
                    self.hp[j] -= 1
                    rewards[a] += 1.0
                    break
        self.t += 1
        dead = [a for a in acting if self.hp[self.index[a]] <= 0]
        for a in dead:
            rewards[a] -= 1.0
            self.cell[tuple(self.pos[self.index[a]])] = -1
        gone = set(dead)
        survivors = [a for a in acting if a not in gone]
        wiped = len({self.team[a] for a in survivors}) < 2
        time_up = self.t >= self.max_cycles
        terminations = {a: a in gone or wiped for a in acting}
        truncations = {a: time_up and not terminations[a] for a in acting}
        views = self._views()
        obs = {a: views[self.team[a]][self._window(a)] for a in acting}   # the dead see their last view
        self.agents = [] if wiped or time_up else survivors
        return obs, rewards, terminations, truncations, {a: {} for a in acting}


def make_env(n_agents: int = 12, hp: int = 3, max_cycles: int = 100, render_mode=None) -> GridBattleEnv:
    return GridBattleEnv(n_agents, hp, max_cycles, render_mode)


ENV_FACTORY = "scaling:make_env"   # this file's folder is on sys.path when it runs as a script


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
    from marlkit.agents.random_policy import RandomAgent
    from marlkit.envs.factory import make_env_vector
    venv = make_env_vector(cfg.env, cfg.runner)
    try:
        agents = {g: RandomAgent(gs, venv.spec.state_shape, None, venv.num_envs, 1, seed=i)
                  for i, (g, gs) in enumerate(venv.spec.groups.items())}
        obs = venv.reset(seed=0)
        n_steps = max(1, steps // venv.num_envs)
        with AgentStepCounter() as counter:
            start = time.perf_counter()
            for _ in range(n_steps):
                actions = {g: a.act(obs.obs[g], obs.state, obs.agent_mask[g], obs.action_mask[g], None).actions
                           for g, a in agents.items()}
                obs = venv.step(actions).next
            elapsed = time.perf_counter() - start
    finally:
        venv.close()
    return {"env_steps_per_s": n_steps * venv.num_envs / elapsed, "agent_steps_per_s": counter.count / elapsed}


def train(yaml_path: str, overrides: dict, steps: int, profile: cProfile.Profile | None = None) -> dict:
    import marlkit
    with tempfile.TemporaryDirectory() as root, AgentStepCounter() as counter:
        if profile is not None:
            profile.enable()
        result = marlkit.run(agent="MAPPO", env=yaml_path, logger="none", **{
            **overrides, "runner.total_steps": steps, "runner.progress": False, "runner.run_root": root,
            "runner.save_interval": 10 ** 9})
        if profile is not None:
            profile.disable()
    # the training loop's own time: building agents and envs is left out
    rate = result.metrics["perf/env_steps_per_s_overall"]
    seconds = result.steps / rate
    return {"env_steps_per_s": rate, "agent_steps_per_s": counter.count / seconds, "seconds": seconds}


def train_flops(yaml_path: str, overrides: dict, steps: int) -> float:
    """Matmul and convolution FLOPs per env step of a training run (acting and updates). Per env
    step, not per acting agent: the networks run over every agent slot, alive or not, so the
    count does not depend on how many agents a short run happens to keep alive."""
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as counter:
        run = train(yaml_path, overrides, steps)
    return counter.get_total_flops() / (run["env_steps_per_s"] * run["seconds"])


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", nargs="+", type=int, default=[4, 12, 24, 48], help="values of N")
    parser.add_argument("--steps", type=int, default=20_000, help="env steps per measurement")
    parser.add_argument("--parallels", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--critics", nargs="+", default=["pooled", "state"], choices=["pooled", "state"],
                        help="MAPPO critic inputs to train with")
    parser.add_argument("--profile-steps", type=int, default=5_000)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="training config overrides")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()

    import torch

    from marlkit.api import build_config
    from marlkit.config import parse_set

    torch.set_num_threads(1)
    overrides = {**parse_set(args.set), "runner.parallels": args.parallels}
    report = {"parallels": args.parallels, "steps_per_measurement": args.steps, "repeats": args.repeats,
              "critics": args.critics,
              "overrides": args.set, "observation": [VIEW, VIEW, CHANNELS],
              "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared), Python {platform.python_version()}",
              "torch": torch.__version__, "matmul_peak_flops": matmul_peak(), "rows": []}
    print(f"matmul peak on {os.cpu_count()} cores: {report['matmul_peak_flops'] / 1e9:.0f} GFLOP/s", flush=True)
    out = Path(__file__).parent / "results" / f"scaling{('_' + args.tag) if args.tag else ''}.json"
    with tempfile.TemporaryDirectory() as folder:
        for n in args.agents:
            path = env_yaml(Path(folder), n)
            cfg = build_config("MAPPO", path, **overrides)
            critic = {c: {**overrides, "agents.MAPPO.critic_input": c} for c in args.critics}
            samples = {"bare": [], "vector": [], **{f"train_{c}": [] for c in args.critics}}
            for _ in range(args.repeats):
                samples["bare"].append(bare_env(n, max(1, args.steps // 4)))
                samples["vector"].append(vector_env(cfg, args.steps))
                for c in args.critics:
                    samples[f"train_{c}"].append(train(path, critic[c], args.steps))
            med = {k: {m: statistics.median(s[m] for s in v) for m in ("env_steps_per_s", "agent_steps_per_s")}
                   for k, v in samples.items()}
            profile = cProfile.Profile()
            train(path, critic[args.critics[0]], args.profile_steps, profile)
            row = {"n_agents": n, "state_shape": list(cfg_state_shape(cfg)), "samples": samples, "median": med,
                   "agents_acting_per_step": statistics.mean(s["agents_acting_per_step"] for s in samples["bare"]),
                   "critics": {}, "profile_critic": args.critics[0], "profile_top": top_entries(profile)}
            print(f"N={n:>3}: bare {med['bare']['agent_steps_per_s']:>8.0f}, vector "
                  f"{med['vector']['agent_steps_per_s']:>8.0f} agent-steps/s", flush=True)
            for c in args.critics:
                flops = train_flops(path, critic[c], args.profile_steps)
                trained = med[f"train_{c}"]
                acting = trained["agent_steps_per_s"] / trained["env_steps_per_s"]
                row["critics"][c] = {
                    "train_flops_per_env_step": flops, "train_flops_per_agent_step": flops / acting,
                    # no implementation of this update can train faster here than its arithmetic at peak
                    "ceiling_agent_steps_per_s": report["matmul_peak_flops"] / flops * acting,
                    "train_over_vector_agent_steps": trained["agent_steps_per_s"] / med["vector"]["agent_steps_per_s"],
                    "train_over_bare_agent_steps": trained["agent_steps_per_s"] / med["bare"]["agent_steps_per_s"]}
                print(f"      critic {c:>6}: train {trained['agent_steps_per_s']:>8.0f} agent-steps/s, train/vector "
                      f"{row['critics'][c]['train_over_vector_agent_steps']:.3f}; {flops / acting / 1e6:.1f} MFLOP "
                      f"per agent step: at most {row['critics'][c]['ceiling_agent_steps_per_s']:.0f} agent-steps/s "
                      "here at matmul peak", flush=True)
            report["rows"].append(row)
            for entry in row["profile_top"][:6]:
                print(f"      {entry['share']:6.1%}  {entry['function']}", flush=True)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report, indent=2))
    print(f"written {out}")
    return 0


def cfg_state_shape(cfg) -> tuple[int, ...]:
    from marlkit.envs.factory import make_env
    env = make_env(cfg.env)
    try:
        return tuple(env.spec.state_shape)
    finally:
        env.close()


if __name__ == "__main__":
    # run as the module the env factory names ("scaling"), so that the step counter patches the
    # class the vector envs build, not a __main__ twin of it
    from scaling import main as scaling_main
    sys.exit(scaling_main())

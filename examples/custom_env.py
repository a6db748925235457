"""Train marlkit on your own PettingZoo ParallelEnv through a YAML file, with no marlkit code changes.

The env below, ``Rendezvous``, is a small cooperative game: agents on a 1-D track are rewarded for
standing close to each other. ``examples/configs/rendezvous.yaml`` points marlkit at it with
``env.factory: custom_env:make_env``.

    python examples/custom_env.py                      # train MAPPO with the YAML
    python examples/custom_env.py --steps 2000         # tiny budget (what CI runs)
    marlkit --env examples/configs/rendezvous.yaml     # the same from the CLI (with examples/ on PYTHONPATH)

``RendezvousInArrays`` is the same game written in ``[A, ...]`` arrays (``env.kwargs.arrays: true``):
an env whose agents' data already sit in arrays declares it by subclassing ``ArrayParallelEnv``,
and marlkit reads its arrays without a Python loop over agents (docs/extending.md).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from marlkit.envs.array_env import ArrayParallelEnv


class Rendezvous(ParallelEnv):
    """``n_agents`` on positions 0..size-1; actions: left, stay, right; reward: minus the spread."""

    metadata = {"name": "rendezvous_v0", "render_fps": 5}

    def __init__(self, n_agents: int = 3, size: int = 9, max_steps: int = 20, render_mode=None):
        self.possible_agents = [f"walker_{i}" for i in range(n_agents)]
        self.size, self.max_steps, self.render_mode = size, max_steps, render_mode
        # own position and everyone's positions, scaled to [0, 1]
        self._obs_space = spaces.Box(0.0, 1.0, (1 + n_agents,), np.float32)
        self._act_space = spaces.Discrete(3)

    def observation_space(self, agent):
        return self._obs_space

    def action_space(self, agent):
        return self._act_space

    def _observe(self):
        scaled = self.pos / (self.size - 1)
        return {a: np.concatenate([[scaled[i]], scaled]).astype(np.float32) for i, a in enumerate(self.agents)}

    def reset(self, seed=None, options=None):
        if seed is not None or not hasattr(self, "rng"):
            self.rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.pos = self.rng.integers(0, self.size, len(self.agents))
        self.t = 0
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions):
        moves = np.array([actions[a] - 1 for a in self.agents])
        self.pos = np.clip(self.pos + moves, 0, self.size - 1)
        self.t += 1
        reward = -float(self.pos.max() - self.pos.min()) / (self.size - 1)
        done = self.t >= self.max_steps
        obs = self._observe()
        rewards = {a: reward for a in self.agents}
        terminations = {a: False for a in self.agents}
        truncations = {a: done for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, terminations, truncations, {a: {} for a in obs}

    def render(self):
        frame = np.full((20, 20 * self.size, 3), 255, np.uint8)
        for p in self.pos:
            frame[5:15, 20 * p + 5: 20 * p + 15] = (40, 90, 200)
        return frame


class RendezvousInArrays(ArrayParallelEnv, Rendezvous):
    """The same game in arrays over ``possible_agents``: PettingZoo's dict API comes with
    ``ArrayParallelEnv``, built from the two methods below."""

    def _observations(self) -> np.ndarray:
        scaled = self.pos / (self.size - 1)
        return np.concatenate([scaled[:, None], np.tile(scaled, (len(scaled), 1))], axis=1).astype(np.float32)

    def reset_arrays(self, seed=None):
        if seed is not None or not hasattr(self, "rng"):
            self.rng = np.random.default_rng(seed)
        self.pos = self.rng.integers(0, self.size, len(self.possible_agents))
        self.t = 0
        return self._observations(), {}

    def step_arrays(self, actions):
        self.pos = np.clip(self.pos + actions - 1, 0, self.size - 1)
        self.t += 1
        n = len(self.possible_agents)
        reward = np.full(n, -float(self.pos.max() - self.pos.min()) / (self.size - 1), np.float32)
        return self._observations(), reward, np.zeros(n, bool), np.full(n, self.t >= self.max_steps), {}


def make_env(arrays: bool = False, **kwargs) -> Rendezvous:
    """What ``env.factory`` names in the YAML; YAML ``env.kwargs`` arrive here."""
    return RendezvousInArrays(**kwargs) if arrays else Rendezvous(**kwargs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agent", default="MAPPO")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--run-root", default="runs")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))  # so that 'custom_env:make_env' imports this file
    import marlkit

    result = marlkit.run(agent=args.agent, env=str(Path(__file__).parent / "configs" / "rendezvous.yaml"),
                         mode="benchmark", **{"runner.total_steps": args.steps, "runner.run_root": args.run_root})
    first, last = result.evaluations[0]["mean"]["walkers"], result.evaluations[-1]["mean"]["walkers"]
    print(f"eval return of the walkers: {first:.2f} before training, {last:.2f} after {result.steps} steps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A synthetic PettingZoo grid battle: N agents in two groups (``red_*``, ``blue_*``) with 13x13x5
uint8 image observations and agents that die. ``benchmarks/scaling.py`` measures marlkit on it for
several N, and the tests use it as an env with images, many agents and deaths: as an env YAML's
factory it is ``grid_battle:make_env`` with ``benchmarks/`` on sys.path.

The env is cheap per agent and linear in N: layer maps are built once per step, every agent's view
is a slice of them, and attacks look up a grid of agent indices.
"""
from __future__ import annotations

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

"""A Unity scene as a PettingZoo ``ParallelEnv``, for code outside marlkit that speaks PettingZoo
(a replacement for mlagents' own wrapper, which drops terminal and group rewards; see docs/envs.md).

PettingZoo agents cannot come back once done, while Unity agents start a new episode at once. So a
PettingZoo episode here is every agent's own episode after a reset: an agent leaves ``agents`` when
its episode ends (its final observation, reward and terminated/truncated flags are handed over in
that step), and until every agent is done the scene keeps those agents busy with their first
allowed action. An agent that asks for no decision this step stays in ``agents`` with its last
observation; the action given for it is not sent.

Observations are ``{"observation": obs, "action_mask": mask}`` for discrete actions (``mask`` int8,
1 = allowed, one array per branch for MultiDiscrete: what ``action_space.sample(mask=...)``
takes), the bare observation for continuous ones. Hybrid actions are ``(continuous values, branch
choices)`` tuples of ``Tuple((Box, MultiDiscrete))``, their mask one array per branch.
"""
from __future__ import annotations

import functools

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from marlkit.envs.unity.env import UnityConfig, UnityEnv
from marlkit.spec import hybrid_parts


class UnityParallelEnv(ParallelEnv):
    metadata = {"name": "unity_parallel_v0", "render_modes": []}

    def __init__(self, cfg: UnityConfig | None = None, **settings):
        """``UnityParallelEnv(file_name=...)`` takes :class:`UnityConfig`'s fields (or one ``cfg``)."""
        self.env = UnityEnv(cfg if cfg is not None else UnityConfig(**settings))
        self.slot: dict[str, tuple[str, int]] = {}
        self._obs_spaces, self._act_spaces = {}, {}
        for g, gs in self.env.spec.groups.items():
            space = gs.action_space
            branches = self._branches(space)
            if isinstance(space, spaces.Discrete):
                ob_space = spaces.Dict({"observation": gs.observation_space,
                                        "action_mask": spaces.Box(0, 1, (int(space.n),), np.int8)})
            elif branches:
                masks = spaces.Tuple([spaces.Box(0, 1, (n,), np.int8) for n in branches])
                ob_space = spaces.Dict({"observation": gs.observation_space, "action_mask": masks})
            else:
                ob_space = gs.observation_space
            for s, agent in enumerate(gs.agents):
                self.slot[agent] = (g, s)
                self._obs_spaces[agent], self._act_spaces[agent] = ob_space, space
        self.possible_agents = list(self.slot)
        self.agents: list[str] = []
        self._ob = None

    @staticmethod
    def _branches(space: spaces.Space) -> list[int]:
        """Branch sizes of a MultiDiscrete or hybrid space (else [])."""
        if isinstance(space, spaces.MultiDiscrete):
            return [int(n) for n in space.nvec]
        hybrid = hybrid_parts(space)
        return hybrid[1] if hybrid is not None else []

    @functools.lru_cache(maxsize=None)
    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_spaces[agent]

    @functools.lru_cache(maxsize=None)
    def action_space(self, agent: str) -> spaces.Space:
        return self._act_spaces[agent]

    def _agent_obs(self, ob, agent: str):
        g, s = self.slot[agent]
        space = self._act_spaces[agent]
        if isinstance(space, spaces.Box):
            return ob.obs[g][s]
        mask = ob.action_mask[g][s].astype(np.int8)
        branches = self._branches(space)
        if branches:
            mask = tuple(np.split(mask, np.cumsum(branches)[:-1]))
        return {"observation": ob.obs[g][s], "action_mask": mask}

    def reset(self, seed: int | None = None, options: dict | None = None):
        self._ob = self.env.reset(seed=seed)
        self.agents = list(self.possible_agents)
        self._last = {a: self._agent_obs(self._ob, a) for a in self.agents}
        return dict(self._last), {a: {} for a in self.agents}

    def _joint_actions(self, actions: dict) -> dict[str, np.ndarray]:
        """Per group ``[A, ...]``: the given actions, and the first allowed choice per branch (or
        zeros) for agents that are done but still asked to act by the scene."""
        out = {}
        for g, gs in self.env.spec.groups.items():
            space = gs.action_space
            mask, branches, hybrid = self._ob.action_mask[g], self._branches(space), hybrid_parts(space)
            if isinstance(space, spaces.Discrete):
                arr = mask.argmax(-1)
            elif branches:
                arr = np.stack([m.argmax(-1) for m in np.split(mask, np.cumsum(branches)[:-1], -1)], -1)
                if hybrid is not None:
                    arr = np.concatenate([np.zeros((gs.n_agents, hybrid[0])), arr], -1).astype(np.float32)
            else:
                arr = np.zeros((gs.n_agents,) + space.shape, np.float32)
            out[g] = arr
        for agent, action in actions.items():
            g, s = self.slot[agent]
            out[g][s] = np.concatenate([np.ravel(part) for part in action]) if isinstance(action, tuple) else action
        return out

    def step(self, actions: dict):
        unknown = [a for a in actions if a not in self.agents]
        if unknown:
            raise KeyError(f"action for {unknown[0]!r}, which is not in env.agents (done, or not an agent of "
                           "this scene); reset() starts a new episode")
        ob, reward, terminated, truncated, _ = self.env.step(self._joint_actions(actions))
        rew, term, trunc, info = {}, {}, {}, {}
        for agent in self.agents:
            g, s = self.slot[agent]
            rew[agent] = float(reward[g][s])
            term[agent], trunc[agent] = bool(terminated[g][s]), bool(truncated[g][s])
            info[agent] = {}
            if term[agent] or trunc[agent]:
                self._last[agent] = self._agent_obs(ob.final, agent)
            elif ob.agent_mask[g][s]:
                self._last[agent] = self._agent_obs(ob, agent)
        obs = {a: self._last[a] for a in self.agents}
        self.agents = [a for a in self.agents if not (term[a] or trunc[a])]
        self._ob = ob
        return obs, rew, term, trunc, info

    def close(self) -> None:
        self.env.close()

"""Gymnasium multi-agent envs in the form EPyMARL's ``gymma`` plays them (Level-Based Foraging,
Multi-Robot Warehouse) as a :class:`~marlkit.envs.core.MultiAgentEnv`.

Such an env is a plain ``gymnasium.Env`` whose observation and action spaces are Tuples of per-agent
spaces: ``reset`` returns a tuple of observations, ``step`` takes one action per agent and returns
per-agent observations and rewards, and ``terminated``/``truncated`` either for the whole env or
per agent. The agents are ``agent_0 .. agent_{n-1}``, in one group ``agents`` unless ``env.groups``
says otherwise; the global state is their observations concatenated.
"""
from __future__ import annotations

import importlib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

import numpy as np
from gymnasium import spaces

from marlkit.config import ConfigError, EnvConfig, value_range
from marlkit.envs.array_env import AgentRows, bad_action, env_actions
from marlkit.envs.core import EnvAPIError, EnvSpec, GroupSpec, MultiAgentEnv, Observation, empty_observation
from marlkit.envs.pettingzoo import assign_groups, default_state
from marlkit.registry import closest, register_env

# Step limits that these envs keep themselves and report as a termination (lbforaging's
# max_episode_steps, rware's max_steps). The adapter reads them as the default time limit and
# switches them off, so that it can end the episode as the truncation it is.
OWN_LIMITS = ("_max_episode_steps", "max_steps")
ARRAYS_FROM = 4   # agents from which reading them as arrays is the cheaper path (measured: 2 agents 1.24x, 4 0.90x)


@dataclass
class GymmaConfig(EnvConfig):
    type: str = "gymma"
    id: str = ""          # "module:EnvId"; the module is imported first, which registers its envs
    kwargs: dict[str, Any] = field(default_factory=dict)   # passed to gymnasium.make
    # steps per episode, ended as a truncation; null: the env's own limit
    time_limit: Optional[int] = field(default=None, metadata=value_range(1))
    # team: every agent is paid the sum of all agents' rewards (EPyMARL's common reward, summed)
    reward: Literal["individual", "team"] = "team"


def make_gymma(env_id: str, kwargs: dict[str, Any]):
    """``gymnasium.make`` of ``"module:EnvId"`` with errors that name the key and the fix."""
    import gymnasium
    if not env_id:
        raise ConfigError("env.id is empty; set it to 'module:EnvId', e.g. "
                          "'lbforaging:Foraging-8x8-2p-2f-coop-v3'")
    module_name, _, name = env_id.rpartition(":")
    if module_name:
        try:
            importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigError(f"env.id: cannot import module {module_name!r} ({exc}); install it, e.g. "
                              "pip install -e .[games] for lbforaging and rware") from None
    if name not in gymnasium.registry:
        raise ConfigError(f"env.id: {name!r} is not a registered gymnasium env{closest(name, gymnasium.registry)}"
                          + ("" if module_name else "; name the module that registers it, as 'module:EnvId'"))
    try:
        # the env checker is written for single-agent envs and warns about every list of rewards
        return gymnasium.make(name, disable_env_checker=True, **kwargs)
    except TypeError as exc:
        if "argument" not in str(exc):
            raise
        raise ConfigError(f"env.kwargs: {name!r} refused them ({exc}); env.kwargs was {dict(kwargs)!r}") from None


def _per_agent(value, n: int, what: str, t: int) -> np.ndarray:
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
        array = np.asarray(list(value), dtype=bool)
        if array.shape != (n,):
            raise EnvAPIError(f"step {t}: the env returned {what} {value!r}; expected a bool or one per agent ({n})")
        return array
    return np.full(n, bool(value))


@register_env("gymma")
class GymmaEnv(MultiAgentEnv):
    config_cls = GymmaConfig

    @classmethod
    def from_config(cls, cfg: GymmaConfig, render: bool = False, index: int = 0) -> "GymmaEnv":
        limits = [x for x in (cfg.time_limit, cfg.max_episode_steps) if x is not None]
        adapter = cls(make_gymma(cfg.id, cfg.kwargs), groups=cfg.groups, reward=cfg.reward,
                      time_limit=min(limits) if limits else None)
        adapter.exact_resume = cfg.exact_resume
        return adapter

    @classmethod
    def check_config(cls, cfg) -> None:
        make_gymma(cfg.env.id, cfg.env.kwargs).close()

    def __init__(self, env, groups: dict[str, list[str]] | None = None, reward: str = "team",
                 time_limit: int | None = None):
        obs_space, act_space = env.observation_space, env.action_space
        if not isinstance(obs_space, spaces.Tuple) or not isinstance(act_space, spaces.Tuple) \
                or len(obs_space) != len(act_space):
            raise ConfigError(f"env.id: {env.spec.id if env.spec else env!r} has observation space {obs_space} and "
                              f"action space {act_space}, not Tuples of one space per agent")
        self.env = env
        self.reward = reward
        self.n = len(obs_space)
        own_limit = self._take_own_limit(env)
        self.time_limit = time_limit if time_limit is not None else own_limit
        names = [f"agent_{i}" for i in range(self.n)]
        # a Dict or Tuple observation reaches the agents flattened, as EPyMARL's gymma gives it
        self._flatten = [not isinstance(s, spaces.Box) for s in obs_space]
        self._obs_space = [spaces.flatten_space(s) if flat else s for s, flat in zip(obs_space, self._flatten)]
        self._act_space = list(act_space)
        for i, s in enumerate(self._act_space):
            if not isinstance(s, (spaces.Discrete, spaces.MultiDiscrete, spaces.Box)):
                raise ConfigError(f"env.id: agent_{i}'s action space {s} is not Discrete, MultiDiscrete or Box")

        index = {name: i for i, name in enumerate(names)}

        def same_spaces(members):
            first = index[members[0]]
            return all(self._obs_space[index[m]] == self._obs_space[first]
                       and self._act_space[index[m]] == self._act_space[first] for m in members)

        members = assign_groups(names, groups, same_spaces)
        for g, group_names in members.items():
            if not same_spaces(group_names):
                raise ConfigError(f"env.groups: agents of group {g!r} ({group_names}) have different spaces; "
                                  "split them with env.groups, one group per space")
        self.groups = {g: GroupSpec(g, m, self._obs_space[index[m[0]]], self._act_space[index[m[0]]])
                       for g, m in members.items()}
        self._slot = [None] * self.n
        for g, gs in self.groups.items():
            for k, name in enumerate(gs.agents):
                self._slot[index[name]] = (g, k)
        state_shape, state_dtype, _ = default_state([self._obs_space[index[a]] for gs in self.groups.values()
                                                     for a in gs.agents], "concat")
        self.spec = EnvSpec(self.groups, state_shape, render_fps=int(env.metadata.get("render_fps", 10) or 10),
                            state_dtype=state_dtype, state_from_obs=True, episode_limit=self.time_limit)
        # four or more agents alike (one Box observation, one action space) are read as [A, ...]
        # arrays, one index per group, at a cost that does not grow with them; fewer, or unlike,
        # agent by agent, which is cheaper for 2 (benchmarks/env_side.py --gymma-adapter)
        self._alike = self.n >= ARRAYS_FROM and not any(self._flatten) \
            and all(s == self._obs_space[0] for s in self._obs_space) \
            and all(s == self._act_space[0] for s in self._act_space)
        self._rows = AgentRows(names, members)
        self._rows_first = next(iter(members))
        self._names = names
        self._t = 0
        self._done = np.zeros(self.n, bool)
        self._team_return = 0.0

    @staticmethod
    def _take_own_limit(env) -> int | None:
        """The env's own step limit, switched off where the env would report it as a termination."""
        base = env.unwrapped
        for name in OWN_LIMITS:
            value = getattr(base, name, None)
            if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
                setattr(base, name, math.inf)
                return int(value)
        return env.spec.max_episode_steps if env.spec is not None else None

    # ------------------------------------------------------------------ conversion

    def _observe(self, obs, info: dict) -> Observation:
        if len(obs) != self.n:
            raise EnvAPIError(f"step {self._t}: the env returned {len(obs)} observations for {self.n} agents")
        masks = info.get("action_mask") if isinstance(info, dict) else None
        if self._alike:
            return self._observe_arrays(obs, masks)
        out = empty_observation(self.spec)
        for i, value in enumerate(obs):
            g, k = self._slot[i]
            space = self._obs_space[i]
            value = spaces.flatten(self.env.observation_space[i], value) if self._flatten[i] else np.asarray(value)
            if value.shape != space.shape:
                raise EnvAPIError(f"step {self._t}: observation of agent_{i} has shape {value.shape}, "
                                  f"but its observation space says {space.shape}")
            out.obs[g][k] = value
            out.agent_mask[g][k] = not self._done[i]
            if masks is not None and self.groups[g].n_actions:
                mask = np.asarray(masks[i], dtype=bool)
                if mask.shape != (self.groups[g].n_actions,) or not mask.any():
                    raise EnvAPIError(f"step {self._t}: info['action_mask'][{i}] is {mask.tolist()}; expected "
                                      f"{self.groups[g].n_actions} bools, at least one True")
                out.action_mask[g][k] = mask
        out.state[:] = np.concatenate([o.reshape(-1) for o in out.obs.values()])
        return out

    def _observe_arrays(self, obs, masks) -> Observation:
        """:meth:`_observe` for agents alike: the observations stacked ``[A, ...]``, then one index per group."""
        shape = self._obs_space[0].shape
        shapes = {np.shape(o) for o in obs}
        if shapes != {shape}:
            raise EnvAPIError(f"step {self._t}: the env's observations have shapes {[np.shape(o) for o in obs]}, "
                              f"but the observation space says {shape} for every agent")
        obs = np.stack(obs)
        out = empty_observation(self.spec)
        live = ~self._done
        if masks is not None and self.spec.groups[self._rows_first].n_actions:
            masks = np.asarray(masks, dtype=bool)
            n_actions = self.spec.groups[self._rows_first].n_actions
            if masks.shape != (self.n, n_actions) or not masks.any(1).all():
                raise EnvAPIError(f"step {self._t}: info['action_mask'] is {masks.tolist()}; expected "
                                  f"{n_actions} bools per agent, at least one True")
        for g, r in self._rows.rows.items():
            out.obs[g][:] = obs[r]
            out.agent_mask[g][:] = live[r]
            if masks is not None:
                out.action_mask[g][:] = masks[r]
        out.state[:] = np.concatenate([o.reshape(-1) for o in out.obs.values()])
        return out

    def _env_action(self, i: int, action: np.ndarray):
        space = self._act_space[i]
        if isinstance(space, spaces.Box):
            return np.clip(action, space.low, space.high).astype(space.dtype)
        index = np.asarray(action, dtype=np.int64)
        high = space.n if isinstance(space, spaces.Discrete) else space.nvec
        if not ((index >= 0) & (index < high)).all():
            raise bad_action(f"agent_{i}", index, space, self._t)
        return int(index) + int(space.start) if isinstance(space, spaces.Discrete) else index + space.start

    # ------------------------------------------------------------------ contract

    def reset(self, seed: int | None = None) -> Observation:
        self._t = 0
        self._done[:] = False
        self._team_return = 0.0
        obs, info = self.env.reset(seed=seed)
        return self._observe(obs, info)

    def step(self, actions: dict[str, np.ndarray]):
        self._t += 1
        if self._alike:
            first = actions[self._rows_first]
            joint = self._rows.join(actions, np.zeros((self.n, *first.shape[1:]), first.dtype))
            joint = env_actions(joint, ~self._done, self._act_space[0], self._names, self._t).tolist()
        else:
            joint = [self._env_action(i, actions[g][k]) for i, (g, k) in enumerate(self._slot)]
        obs, rewards, terminated, truncated, info = self.env.step(joint)
        if isinstance(rewards, Iterable):
            rewards = np.asarray(list(rewards), dtype=np.float32)
            if rewards.shape != (self.n,):
                raise EnvAPIError(f"step {self._t}: the env returned {rewards.size} rewards for {self.n} agents")
            team = float(rewards.sum())
        else:   # one common reward: the team's, paid to every agent whichever env.reward
            team = float(rewards)
            rewards = np.full(self.n, team, np.float32)
        self._team_return += team
        if self.reward == "team":
            rewards = np.full(self.n, team, np.float32)
        term = _per_agent(terminated, self.n, "terminated", self._t)
        trunc = _per_agent(truncated, self.n, "truncated", self._t) & ~term
        if self.time_limit is not None and self._t >= self.time_limit:
            trunc |= ~term
        # an agent's episode ends once; an agent whose episode ended before its env's is absent
        ended = (term | trunc) & ~self._done
        self._done |= ended
        observation = self._observe(obs, info)
        rows = self._rows
        return (observation, rows.split(rewards), rows.split(term & ended), rows.split(trunc & ended),
                bool(self._done.all()))

    def episode_stats(self) -> dict[str, float]:
        """``team_return``: the sum of every agent's rewards over the episode as the env paid them,
        EPyMARL's return, whichever ``env.reward`` the agents learn from."""
        return {"team_return": self._team_return}

    def close(self) -> None:
        self.env.close()

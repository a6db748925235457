"""VMAS (the Vectorized Multi-Agent Simulator) scenarios, stepped as one batch.

A VMAS env is itself a batch: ``num_envs`` copies of a scenario in torch tensors, stepped by one
call. The env type declares it (``batched = True``), and the vector layer then builds
``VmasVectorEnv`` of ``runner.parallels`` envs instead of one Python env per slot: one simulator
step for all of them, observations ``[E, A, obs]`` stacked from its per-agent tensors, no loop over
envs but over the (few) envs whose episode ended, which are reset where they stand.

Every agent of the scenario is in one group ``agents``; the global state is their observations
concatenated. An episode ends as a truncation after ``max_steps`` steps, or as a termination where
the scenario says it is done. Continuous actions are a ``Box`` per agent (the scenario's
``u_range``); ``continuous_actions: false`` gives VMAS's Discrete ones.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

from marlkit.config import ConfigError, EnvConfig, value_range
from marlkit.envs.core import EnvSpec, GroupSpec, MultiAgentEnv, Observation, StepResult, empty_observation
from marlkit.envs.vector.base import VectorEnv
from marlkit.registry import register_env

INSTALL = "pip install 'marlkit[vmas]' (vmas 1.5.2)"


@dataclass
class VmasConfig(EnvConfig):
    type: str = "vmas"
    scenario: str = ""                    # a VMAS scenario's name: navigation, balance, transport, ...
    kwargs: dict[str, Any] = field(default_factory=dict)   # the scenario's own settings (n_agents, ...)
    max_steps: int = field(default=100, metadata=value_range(1))   # steps per episode, ended as a truncation
    continuous_actions: bool = True


def _vmas():
    try:
        import vmas
    except ImportError:
        raise ConfigError(f"env.type: vmas needs the vmas package; {INSTALL}") from None
    return vmas


def _gym_space(space) -> spaces.Space:
    """A VMAS (gym) space as the gymnasium space of the same bounds."""
    if hasattr(space, "n"):
        return spaces.Discrete(int(space.n))
    return spaces.Box(np.asarray(space.low, np.float32), np.asarray(space.high, np.float32), dtype=np.float32)


def _make(cfg: VmasConfig, num_envs: int, seed: int | None = None):
    vmas = _vmas()
    if not cfg.scenario:
        raise ConfigError("env.scenario is empty; name a VMAS scenario, e.g. 'navigation' or 'balance'")
    try:
        return vmas.make_env(cfg.scenario, num_envs=num_envs, device="cpu", continuous_actions=cfg.continuous_actions,
                             max_steps=cfg.max_steps, seed=seed, dict_spaces=False, terminated_truncated=True,
                             clamp_actions=True,   # a Gaussian policy samples past the bounds: clipped, as gym's ClipAction
                             **cfg.kwargs)
    except (ModuleNotFoundError, ImportError) as exc:
        raise ConfigError(f"env.scenario: VMAS has no scenario {cfg.scenario!r} ({exc})") from None
    except TypeError as exc:
        raise ConfigError(f"env.kwargs: VMAS scenario {cfg.scenario!r} refused them ({exc}); "
                          f"env.kwargs was {dict(cfg.kwargs)!r}") from None


def _spec(env, cfg: VmasConfig) -> EnvSpec:
    names = [agent.name for agent in env.agents]
    obs_spaces = [_gym_space(s) for s in env.observation_space]
    act_spaces = [_gym_space(s) for s in env.action_space]
    if any(s != obs_spaces[0] for s in obs_spaces) or any(s != act_spaces[0] for s in act_spaces):
        raise ConfigError(f"env.scenario: {cfg.scenario!r} gives its agents different spaces, which marlkit's VMAS "
                          "adapter does not group yet; pick a scenario of alike agents")
    group = GroupSpec("agents", names, obs_spaces[0], act_spaces[0])
    size = int(np.prod(obs_spaces[0].shape)) * len(names)
    return EnvSpec({"agents": group}, (size,), state_from_obs=True, episode_limit=cfg.max_steps)


@register_env("vmas")
class VmasEnv(MultiAgentEnv):
    """The env type: its envs come as one batch (``vector_env``), never one at a time."""

    config_cls = VmasConfig
    batched = True

    @classmethod
    def vector_env(cls, cfg: VmasConfig, num_envs: int, render: bool = False, first_index: int = 0) -> "VmasVectorEnv":
        return VmasVectorEnv(cfg, num_envs, render)

    @classmethod
    def from_config(cls, cfg: VmasConfig, render: bool = False, index: int = 0):
        raise ConfigError("env.type: vmas steps its envs as one batch; build them with the vector env "
                          "(marlkit.envs.factory.make_env_vector), not one at a time")

    @classmethod
    def probe_spec(cls, cfg: VmasConfig) -> EnvSpec:
        return _spec(_make(cfg, 1), cfg)

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.runner.vectorize not in ("sync", "auto"):
            raise ConfigError(f"runner.vectorize: {cfg.runner.vectorize} puts envs in workers, but env.type: vmas "
                              "steps all runner.parallels envs as one batched simulation in this process; set "
                              "runner.vectorize: sync")
        _vmas()


class VmasVectorEnv(VectorEnv):
    """``num_envs`` envs of a VMAS scenario, stepped by one simulator call (see the module)."""

    def __init__(self, cfg: VmasConfig, num_envs: int, render: bool = False):
        import torch
        self.torch = torch
        self.env = _make(cfg, num_envs)
        self.spec = _spec(self.env, cfg)
        self.num_envs = num_envs
        self.n_agents = self.spec.groups["agents"].n_agents

    def _observation(self, per_agent: list) -> Observation:
        """VMAS's per-agent ``[E, obs]`` tensors as marlkit's ``[E, A, obs]`` observation."""
        ob = empty_observation(self.spec, (self.num_envs,))
        obs = self.torch.stack(per_agent, 1).numpy().astype(np.float32, copy=False)
        ob.obs["agents"] = obs
        ob.agent_mask["agents"][:] = True
        ob.state = obs.reshape(self.num_envs, -1)
        return ob

    def reset(self, seed: int | None = None) -> Observation:
        if seed is not None:
            self.env.seed(seed)
        return self._observation(self.env.reset())

    def step(self, actions: dict[str, np.ndarray]) -> StepResult:
        batch = self.torch.from_numpy(np.ascontiguousarray(actions["agents"]))
        obs, rewards, terminated, truncated, _ = self.env.step([batch[:, i] for i in range(self.n_agents)])
        final = self._observation(obs)
        terminated, truncated = terminated.numpy(), truncated.numpy() & ~terminated.numpy()
        ended = terminated | truncated
        next_ob = final
        if ended.any():
            for e in np.flatnonzero(ended):
                self.env.reset_at(int(e), return_observations=False)
            next_ob = self._observation(self.env.get_from_scenario(get_observations=True, get_rewards=False,
                                                                   get_infos=False, get_dones=False)[0])
        reward = self.torch.stack(rewards, 1).numpy().astype(np.float32, copy=False)
        per_agent = (self.num_envs, self.n_agents)
        return StepResult(next_ob, {"agents": reward}, {"agents": np.broadcast_to(terminated[:, None], per_agent).copy()},
                          {"agents": np.broadcast_to(truncated[:, None], per_agent).copy()}, ended, final,
                          [{} for _ in range(self.num_envs)], {"agents": np.zeros(per_agent, bool)})

    def render(self, index: int = 0):
        return self.env.render(mode="rgb_array", env_index=index)

    def state_dict(self) -> list[None]:
        return [None] * self.num_envs   # the simulator's tensors are not saved: a resume starts fresh episodes

    def load_state_dict(self, blobs: list) -> bool:
        return False

    def close(self) -> None:
        self.env = None

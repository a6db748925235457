"""Deterministic policies on the off-policy actor-critic: IDDPG, MADDPG (Lowe et al., 2017) and
MATD3 (TD3's twin critics, target-policy smoothing and delayed actor updates, Fujimoto et al., 2018,
with MADDPG's centralised critic)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from marlkit.agents.off_policy_actor_critic import ActorCriticConfig, OffPolicyActorCritic
from marlkit.config import value_range
from marlkit.registry import register_agent


@dataclass
class DDPGConfig(ActorCriticConfig):
    """The actor-critic settings, and the deterministic policy's noise (in ``[-1, 1]`` action units)."""

    exploration_noise: float = field(default=0.1, metadata=value_range(0.0))   # std of what acting adds
    target_noise: float = field(default=0.0, metadata=value_range(0.0))        # TD3's target-policy smoothing std
    target_noise_clip: float = field(default=0.5, metadata=value_range(0.0))


@dataclass
class IDDPGConfig(DDPGConfig):
    critic_scope: Literal["agent", "joint"] = "agent"


@dataclass
class MATD3Config(DDPGConfig):
    n_critics: int = field(default=2, metadata=value_range(1, 2))
    policy_delay: int = field(default=2, metadata=value_range(1))
    target_noise: float = field(default=0.2, metadata=value_range(0.0))


class DeterministicPolicy(OffPolicyActorCritic):
    """``tanh`` of the actor head: the action itself; acting adds Gaussian noise, and the target's
    next action may be smoothed with clipped noise (``target_noise``)."""

    config_cls = DDPGConfig

    def policy_outputs(self) -> int:
        return self.action_size

    def policy_actions(self, out: torch.Tensor, explore: bool, noise) -> tuple[torch.Tensor, None]:
        actions = torch.tanh(out)
        if explore and self.cfg.exploration_noise:
            actions = (actions + self.cfg.exploration_noise * noise.normal(actions.shape)).clamp(-1, 1)
        return actions, None

    def target_actions(self, out: torch.Tensor, noise) -> tuple[torch.Tensor, None]:
        actions, cfg = torch.tanh(out), self.cfg
        if cfg.target_noise:
            smoothing = (cfg.target_noise * noise.normal(actions.shape)).clamp(-cfg.target_noise_clip,
                                                                               cfg.target_noise_clip)
            actions = (actions + smoothing).clamp(-1, 1)
        return actions, None


@register_agent("IDDPG")
class IDDPG(DeterministicPolicy):
    """DDPG for each agent: a critic of its own observation and action (weights shared, ids apart)."""

    config_cls = IDDPGConfig


@register_agent("MADDPG")
class MADDPG(DeterministicPolicy):
    """DDPG with a centralised critic of the global state and every agent's action."""


@register_agent("MATD3")
class MATD3(DeterministicPolicy):
    """MADDPG with TD3's twin critics, target-policy smoothing and delayed actor updates."""

    config_cls = MATD3Config

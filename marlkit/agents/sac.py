"""Soft actor-critics on the off-policy actor-critic: ISAC and MASAC (SAC, Haarnoja et al., 2018,
with a critic per agent or a centralised one): a squashed Gaussian policy, twin critics, and an
entropy temperature learned towards ``target_entropy``."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Optional

import numpy as np
import torch
from torch import nn

from marlkit.agents.off_policy_actor_critic import ActorCriticConfig, OffPolicyActorCritic
from marlkit.config import value_range
from marlkit.optim import Adam, gradient_step
from marlkit.registry import register_agent

LOG_STD_RANGE = (-5.0, 2.0)


@dataclass
class SACConfig(ActorCriticConfig):
    """The actor-critic settings with SAC's twin critics, and its temperature."""

    n_critics: int = field(default=2, metadata=value_range(1, 2))
    initial_alpha: float = field(default=1.0, metadata=value_range(0.0))
    learn_alpha: bool = True
    # the entropy the temperature steers each agent's policy to; null: minus the action size (SAC's)
    target_entropy: Optional[float] = None


@dataclass
class ISACConfig(SACConfig):
    critic_scope: Literal["agent", "joint"] = "agent"


class Temperature(nn.Module):
    """SAC's entropy temperature, learned as its log (a module, so checkpoints and snapshots carry it)."""

    def __init__(self, initial: float):
        super().__init__()
        self.log_alpha = nn.Parameter(torch.tensor(float(np.log(initial))))

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.exp()


class SoftActorCritic(OffPolicyActorCritic):
    """``tanh`` of a Gaussian of the actor head's mean and log-std; evaluation takes ``tanh`` of the mean."""

    config_cls = SACConfig
    has_target_actor = False
    stochastic = True
    learner_only = (*OffPolicyActorCritic.learner_only, "temperature_optimizer")

    def __init__(self, group, env, cfg: SACConfig, seed=0, device="cpu"):
        super().__init__(group, env, cfg, seed, device)
        self.target_entropy = -float(self.action_size) if cfg.target_entropy is None else cfg.target_entropy
        self.temperature_optimizer = Adam([{"params": list(self.modules["temperature"].parameters()), "lr": cfg.lr}])

    def extra_modules(self) -> dict[str, nn.Module]:
        return {"temperature": Temperature(self.cfg.initial_alpha)}

    def policy_outputs(self) -> int:
        return 2 * self.action_size

    def policy_actions(self, out: torch.Tensor, explore: bool, noise) -> tuple[torch.Tensor, torch.Tensor | None]:
        mean, log_std = out.chunk(2, -1)
        if not explore:
            return torch.tanh(mean), None
        log_std = log_std.clamp(*LOG_STD_RANGE)
        eps = noise.normal(mean.shape)
        u = mean + log_std.exp() * eps
        actions = torch.tanh(u)
        # the Gaussian's log-density of u, less the log of tanh's slope (the squash's change of variables)
        log_prob = (-0.5 * eps.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1) \
            - (2 * (math.log(2) - u - nn.functional.softplus(-2 * u))).sum(-1)
        return actions, log_prob

    def alpha(self) -> torch.Tensor:
        return self.modules["temperature"].alpha.detach()

    def entropy_bonus(self, log_prob: torch.Tensor) -> torch.Tensor:
        return -self.alpha() * log_prob

    def actor_loss_terms(self, q: torch.Tensor, log_prob: torch.Tensor) -> torch.Tensor:
        return self.alpha() * log_prob - q

    def after_actor_step(self, log_prob: torch.Tensor, weight: torch.Tensor, metrics: dict) -> None:
        metrics["alpha"] = self.alpha()
        metrics["entropy"] = -(log_prob.detach() * weight).sum()
        if not self.cfg.learn_alpha:
            return
        log_alpha = self.modules["temperature"].log_alpha
        loss = -(log_alpha * (log_prob.detach() + self.target_entropy) * weight).sum()
        terms = {"alpha_loss": loss.detach()}
        gradient_step(self.temperature_optimizer, [log_alpha], loss, terms, None, self.who)
        metrics.update(terms)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "temperature_optimizer": self.temperature_optimizer.state_dict()}

    def load_state_dict(self, state: dict, weights_only: bool = False) -> None:
        super().load_state_dict(state, weights_only)
        if not weights_only:
            self.temperature_optimizer.load_state_dict(state["temperature_optimizer"])


@register_agent("ISAC")
class ISAC(SoftActorCritic):
    """SAC for each agent: twin critics of its own observation and action (weights shared, ids apart)."""

    config_cls = ISACConfig


@register_agent("MASAC")
class MASAC(SoftActorCritic):
    """SAC with centralised twin critics of the global state and every agent's action."""

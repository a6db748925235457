"""Action distributions with action masks, and the heads that produce them.

Masked logits are set to a large negative number, so masked actions get probability exactly 0
(never sampled) while entropies and gradients stay finite. ``sample`` draws from a noise source
(``marlkit/random_streams.py``): each env's own random stream while acting.
"""
from __future__ import annotations

import contextlib
import math

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from marlkit.networks.base import init_linear
from marlkit.spec import hybrid_parts

MASKED = -1e9


class Categorical:
    def __init__(self, logits: torch.Tensor, mask: torch.Tensor | None = None):
        if mask is not None:
            logits = torch.where(mask, logits, torch.full_like(logits, MASKED))
        self.log_probs = torch.log_softmax(logits, -1)

    def sample(self, noise) -> torch.Tensor:
        """Gumbel-max: the argmax of the log-probabilities plus Gumbel noise is a draw from the
        distribution, and a masked action (log-probability about -1e9) is never the argmax."""
        gumbel = -torch.log(-torch.log(noise.uniform(self.log_probs.shape)))
        return (self.log_probs + gumbel).argmax(-1)

    def mode(self) -> torch.Tensor:
        return self.log_probs.argmax(-1)

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        return self.log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        return -(self.log_probs.exp() * self.log_probs).sum(-1)


class MultiCategorical:
    """Independent categoricals, one per MultiDiscrete dimension; the mask is their concatenation."""

    def __init__(self, logits: torch.Tensor, nvec: list[int], mask: torch.Tensor | None = None):
        masks = torch.split(mask, nvec, -1) if mask is not None else [None] * len(nvec)
        self.parts = [Categorical(lg, m) for lg, m in zip(torch.split(logits, nvec, -1), masks)]

    def sample(self, noise) -> torch.Tensor:
        return torch.stack([p.sample(noise) for p in self.parts], -1)

    def mode(self) -> torch.Tensor:
        return torch.stack([p.mode() for p in self.parts], -1)

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        return sum(p.log_prob(action[..., i]) for i, p in enumerate(self.parts))

    def entropy(self) -> torch.Tensor:
        return sum(p.entropy() for p in self.parts)


class DiagGaussian:
    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor):
        self.mean, self.log_std = mean, log_std.expand_as(mean)

    def sample(self, noise) -> torch.Tensor:
        return self.mean + self.log_std.exp() * noise.normal(self.mean.shape)

    def mode(self) -> torch.Tensor:
        return self.mean

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        z = (action - self.mean) / self.log_std.exp()
        return (-0.5 * z.pow(2) - self.log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def entropy(self) -> torch.Tensor:
        return (0.5 + 0.5 * math.log(2 * math.pi) + self.log_std).sum(-1)


class Hybrid:
    """Continuous actions (a diagonal Gaussian) and discrete branches (masked categoricals), drawn
    independently; an action is ``[continuous values, branch choices]`` in one float vector."""

    def __init__(self, gaussian: DiagGaussian, branches: MultiCategorical):
        self.gaussian, self.branches = gaussian, branches
        self.n_continuous = gaussian.mean.shape[-1]

    def sample(self, noise) -> torch.Tensor:
        return torch.cat([self.gaussian.sample(noise), self.branches.sample(noise).float()], -1)

    def mode(self) -> torch.Tensor:
        return torch.cat([self.gaussian.mode(), self.branches.mode().float()], -1)

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        n = self.n_continuous
        return self.gaussian.log_prob(action[..., :n]) + self.branches.log_prob(action[..., n:])

    def entropy(self) -> torch.Tensor:
        return self.gaussian.entropy() + self.branches.entropy()


class ActionHead(nn.Module):
    """Features ``[..., in_dim]`` -> a distribution over the group's action space."""

    def __init__(self, action_space: spaces.Space, in_dim: int, log_std_init: float = -0.5):
        super().__init__()
        self.space = action_space
        self.hybrid = hybrid_parts(action_space)
        if self.hybrid is not None:
            self.n_continuous, self.nvec = self.hybrid
            out = self.n_continuous + sum(self.nvec)
            self.log_std = nn.Parameter(torch.full((self.n_continuous,), float(log_std_init)))
        elif isinstance(action_space, spaces.Discrete):
            out = int(action_space.n)
        elif isinstance(action_space, spaces.MultiDiscrete):
            self.nvec = [int(n) for n in np.asarray(action_space.nvec).reshape(-1)]
            out = sum(self.nvec)
        elif isinstance(action_space, spaces.Box):
            out = int(np.prod(action_space.shape))
            self.log_std = nn.Parameter(torch.full((out,), float(log_std_init)))
        else:
            raise TypeError(f"action space {action_space} is not supported; use Discrete, MultiDiscrete, Box "
                            "or Tuple((Box, MultiDiscrete)) (hybrid)")
        self.linear = init_linear(nn.Linear(in_dim, out), gain=0.01)

    def forward(self, features: torch.Tensor, action_mask: torch.Tensor | None = None):
        # float32 whatever the precision of the layers before: autocast's bfloat16 keeps 3 digits,
        # and logits rounded so would put PPO's probability ratios off by a percent or more
        device = features.device.type
        with torch.autocast(device, enabled=False) if torch.is_autocast_enabled(device) else contextlib.nullcontext():
            out = self.linear(features.float())
        if self.hybrid is not None:
            n = self.n_continuous
            return Hybrid(DiagGaussian(out[..., :n], self.log_std), MultiCategorical(out[..., n:], self.nvec, action_mask))
        if isinstance(self.space, spaces.Discrete):
            return Categorical(out, action_mask)
        if isinstance(self.space, spaces.MultiDiscrete):
            return MultiCategorical(out, self.nvec, action_mask)
        return DiagGaussian(out, self.log_std)

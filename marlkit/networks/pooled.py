"""A centralised critic whose cost per agent does not grow with the number of agents.

Each agent's observation goes through one encoder shared by the group (any registered model: a
``cnn`` for images), the agent id joined as for the actor. The group's encodings are pooled over
the agents present, and each agent's value reads its own encoding beside the pool: the design of
mean-field and attention critics. Against a critic on the concatenated observations, whose first
layer grows with ``A x obs size``, the encoder costs the same per agent at any ``A``, and images
reach a ``cnn``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from marlkit.networks.base import ACTIVATIONS, init_linear

POOLS = ("mean", "max", "attention")


class PooledValueHead(nn.Module):
    """Values ``[L, B, A]`` from per-agent encodings ``[L, B, A, F]`` and who is present
    ``agent_mask [L, B, A]`` (None: everyone). With ``n_ids``, each agent's id is a one-hot on the
    hidden layer's input, kept as what it amounts to, a learned per-agent bias: ``F`` additions
    per agent at any ``A``, where a one-hot input costs ``A x F``.

    ``pool``: ``mean`` or ``max`` over the present agents (``A x F`` per env step, so flat per
    agent), or ``attention``: each agent's query weighs the present agents' encodings (one head;
    ``A x A x F`` per env step, so its cost per agent grows with ``A``, though only in this small
    term). Absent agents never enter the pool; an env step with no one present pools zeros.

    The hidden layer reads ``[own, pool]``; its pool half is applied to the pool before it is
    broadcast, so a mean or max pool's share costs once per env step, not once per agent.
    """

    def __init__(self, in_dim: int, n_ids: int = 0, pool: str = "mean", activation: str = "relu"):
        super().__init__()
        if pool not in POOLS:
            raise ValueError(f"pool {pool!r} is not one of {POOLS}")
        self.pool = pool
        if pool == "attention":
            self.query = init_linear(nn.Linear(in_dim, in_dim), gain=1.0)
            self.key = init_linear(nn.Linear(in_dim, in_dim), gain=1.0)
        joint = init_linear(nn.Linear(2 * in_dim + n_ids, in_dim))   # initialised as one layer on [own, pool, id]
        self.hidden = nn.Linear(2 * in_dim, in_dim)
        with torch.no_grad():
            self.hidden.weight.copy_(joint.weight[:, :2 * in_dim])
            self.hidden.bias.copy_(joint.bias)
        self.agent_bias = nn.Parameter(joint.weight[:, 2 * in_dim:].T.detach().clone()) if n_ids else None   # [A, F]
        self.act = ACTIVATIONS[activation]()
        self.out = init_linear(nn.Linear(in_dim, 1), gain=1.0)

    def pooled(self, features: torch.Tensor, agent_mask: torch.Tensor | None) -> torch.Tensor:
        """``[L, B, A, F]`` -> the group's pool as each agent sees it: ``[L, B, 1, F]`` (mean,
        max: the same for every agent) or ``[L, B, A, F]`` (attention)."""
        present = (torch.ones(features.shape[:-1], dtype=torch.bool, device=features.device)
                   if agent_mask is None else agent_mask.bool())
        if self.pool == "attention":
            scores = self.query(features) @ self.key(features).transpose(-1, -2) / math.sqrt(features.shape[-1])
            scores = scores.masked_fill(~present.unsqueeze(-2), float("-inf"))            # [L, B, A, A]
            weights = torch.softmax(scores, -1).nan_to_num(0.0)   # a step with no one present: zeros
            return weights @ features
        mask = present.unsqueeze(-1)
        if self.pool == "max":
            top = features.masked_fill(~mask, float("-inf")).amax(-2, keepdim=True)
            pool = torch.where(mask.any(-2, keepdim=True), top, 0.0)
        else:
            pool = torch.where(mask, features, 0.0).sum(-2, keepdim=True) / mask.sum(-2, keepdim=True).clamp(min=1)
        return pool

    def forward(self, features: torch.Tensor, agent_mask: torch.Tensor | None = None) -> torch.Tensor:
        width = features.shape[-1]
        own, of_pool = self.hidden.weight[:, :width], self.hidden.weight[:, width:]
        hidden = F.linear(features, own, self.hidden.bias) + F.linear(self.pooled(features, agent_mask), of_pool)
        if self.agent_bias is not None:
            hidden = hidden + self.agent_bias
        return self.out(self.act(hidden)).squeeze(-1)

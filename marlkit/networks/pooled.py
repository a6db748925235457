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
from collections.abc import Sequence

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

    ``subteams`` (``GroupSpec.subteams``, per agent slot; None: none) splits the group into
    sub-teams that are independent copies of one game (the fields of a Unity scene): an agent of
    sub-team k > 0 pools over the present agents of sub-team k alone, an agent of sub-team 0 over
    the whole group. A mean or max pool is then one per sub-team (a segment sum or max: ``A x F``
    per env step, still flat per agent), with its pool half applied once per sub-team.
    """

    def __init__(self, in_dim: int, n_ids: int = 0, pool: str = "mean", activation: str = "relu",
                 subteams: Sequence[int] | None = None):
        super().__init__()
        if pool not in POOLS:
            raise ValueError(f"pool {pool!r} is not one of {POOLS}")
        self.pool = pool
        reads = enters = sees = None
        if subteams is not None:
            dense = {t: k + 1 for k, t in enumerate(sorted({t for t in subteams if t}))}
            self.n_pools = len(dense) + 1   # pool 0 is the whole group's, pool k the k-th sub-team's
            reads = torch.tensor([dense.get(t, 0) for t in subteams])
            # the segment of the sub-team pools each agent enters (pool k is segment k - 1); agents
            # of no sub-team enter a spare last segment that no agent reads
            enters = torch.where(reads > 0, reads - 1, len(dense))
            sees = (reads[:, None] == 0) | (reads[:, None] == reads[None, :])   # [A, A]: a's query reaches b
        # not saved: they come from the env's spec, and a checkpoint loads into either design
        self.register_buffer("reads", reads, persistent=False)
        self.register_buffer("enters", enters, persistent=False)
        self.register_buffer("sees", sees if pool == "attention" else None, persistent=False)
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
        max: the same for every agent) or ``[L, B, A, F]`` (attention); with sub-teams, a mean or
        max pool is ``[L, B, n_pools, F]``, agent a reading pool ``reads[a]``."""
        present = (torch.ones(features.shape[:-1], dtype=torch.bool, device=features.device)
                   if agent_mask is None else agent_mask.bool())
        if self.pool == "attention":
            scores = self.query(features) @ self.key(features).transpose(-1, -2) / math.sqrt(features.shape[-1])
            visible = present.unsqueeze(-2) if self.sees is None else present.unsqueeze(-2) & self.sees
            scores = scores.masked_fill(~visible, float("-inf"))            # [L, B, A, A]
            weights = torch.softmax(scores, -1).nan_to_num(0.0)   # a step with no one present: zeros
            return weights @ features
        if self.reads is not None:
            return torch.cat([self._group_pool(features, present), self._subteam_pools(features, present)], -2)
        return self._group_pool(features, present)

    def _subteam_pools(self, features: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        """``[L, B, A, F]`` -> each sub-team's pool over its present agents ``[L, B, n_pools - 1, F]``:
        a segment sum or max, so an agent's pool holds nothing of other sub-teams' features."""
        shape = features.shape[:-2] + (self.n_pools, features.shape[-1])   # the sub-teams and the spare segment
        counts = present.new_zeros(shape[:-1], dtype=features.dtype).index_add_(-1, self.enters,
                                                                               present.to(features.dtype))
        occupied = (counts > 0).unsqueeze(-1)
        mask = present.unsqueeze(-1)
        if self.pool == "max":
            index = self.enters.view(-1, 1).expand(features.shape[-2:]).expand_as(features)
            top = features.new_full(shape, float("-inf")).scatter_reduce(
                -2, index, features.masked_fill(~mask, float("-inf")), "amax")
            pools = torch.where(occupied, top, 0.0)
        else:
            sums = features.new_zeros(shape).index_add_(-2, self.enters, torch.where(mask, features, 0.0))
            pools = sums / counts.clamp(min=1).unsqueeze(-1)
        return pools[..., :-1, :]

    def _group_pool(self, features: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        """``[L, B, A, F]`` -> the whole group's mean or max pool ``[L, B, 1, F]``."""
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
        of_pools = F.linear(self.pooled(features, agent_mask), of_pool)
        if self.reads is not None and self.pool != "attention":
            of_pools = of_pools.index_select(-2, self.reads)   # [L, B, n_pools, F] -> [L, B, A, F]
        hidden = F.linear(features, own, self.hidden.bias) + of_pools
        if self.agent_bias is not None:
            hidden = hidden + self.agent_bias
        return self.out(self.act(hidden)).squeeze(-1)

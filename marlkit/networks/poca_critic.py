"""MA-POCA's critic (Cohen et al., 2021): a value of the agents present and a counterfactual
baseline per agent, both from one residual self-attention over a set of entities.

- value: the entities are the present agents' observation encodings ``g(o_j)``; attention then a
  mean over them gives one value for the team (the same for each of its agents);
- agent i's baseline: agent i's own ``g(o_i)`` beside the others' observation-action encodings
  ``h(o_j, a_j)``, so that it values everything but i's own choice.

Attention over a set with a mask takes any number of agents, and agents that left the episode
are not in the set. With ``subteams`` (``GroupSpec.subteams``: the fields of a Unity scene) an
agent's set holds its own sub-team alone (sub-team 0: the whole group). Each agent is one row of
the attention, so the cost is ``A^2`` per env step in the attention and ``A`` in the encoders.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from marlkit.networks.base import ACTIVATIONS, init_linear


class POCACritic(nn.Module):
    """``forward(features [L, B, A, F], action_features [L, B, A, U], present [L, B, A])`` ->
    (value ``[L, B, A]``, baseline ``[L, B, A]``), normalised as the agent's value normaliser
    sees them; ``value_only`` skips the baseline (acting, bootstrapping)."""

    def __init__(self, in_dim: int, action_dim: int, n_agents: int, width: int = 64, heads: int = 4,
                 activation: str = "relu", subteams: Sequence[int] | None = None):
        super().__init__()
        act = ACTIVATIONS[activation]
        self.obs_embed = nn.Sequential(init_linear(nn.Linear(in_dim, width)), act())
        self.obs_action_embed = nn.Sequential(init_linear(nn.Linear(in_dim + action_dim, width)), act())
        self.norm = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.value_head = nn.Sequential(init_linear(nn.Linear(width, width)), act(), init_linear(nn.Linear(width, 1), 1.0))
        self.baseline_head = nn.Sequential(init_linear(nn.Linear(width, width)), act(),
                                           init_linear(nn.Linear(width, 1), 1.0))
        ids = torch.as_tensor(subteams if subteams is not None else [0] * n_agents)
        # [A, A]: agent i's set may hold agent j (its sub-team, or the whole group for sub-team 0)
        self.register_buffer("sees", (ids[:, None] == 0) | (ids[:, None] == ids[None, :]), persistent=False)
        self.one_team = bool(self.sees.all())   # every agent's set is the whole group: one value per env step

    def _attend(self, entities: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """Residual self-attention over each row's set, then the mean over its members:
        ``entities [N, A, W]``, ``visible [N, A]`` -> ``[N, W]`` (zeros for an empty set)."""
        anyone = visible.any(-1, keepdim=True)
        keys = visible | ~anyone   # an empty set attends to all (a row of -inf would be NaN), then pools 0
        x = self.norm(entities)
        out, _ = self.attention(x, x, x, key_padding_mask=~keys, need_weights=False)
        x = entities + out
        weight = visible.unsqueeze(-1).to(x.dtype)
        return (x * weight).sum(-2) / weight.sum(-2).clamp(min=1.0)

    def forward(self, features: torch.Tensor, action_features: torch.Tensor | None, present: torch.Tensor,
                value_only: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        lead, A = features.shape[:-2], features.shape[-2]
        present = present.bool()
        visible = present.unsqueeze(-2) & self.sees                                  # [L, B, A(i), A(j)]
        obs = self.obs_embed(features)                                              # [L, B, A, W]
        if self.one_team:   # the same set for every agent: attended once, not once per agent
            value = self.value_head(self._attend(obs.reshape(-1, A, obs.shape[-1]), present.reshape(-1, A)))
            value = value.reshape(*lead, 1).expand(*lead, A)
        else:
            rows = obs.unsqueeze(-3).expand(*lead, A, A, obs.shape[-1])
            value = self.value_head(self._attend(rows.reshape(-1, A, obs.shape[-1]), visible.reshape(-1, A)))
            value = value.reshape(*lead, A)
        if value_only:
            return value, None
        others = self.obs_action_embed(torch.cat([features, action_features], -1))   # [L, B, A, W]
        own = torch.eye(A, dtype=torch.bool, device=features.device).unsqueeze(-1)   # [A(i), A(j), 1]
        rows = torch.where(own, obs.unsqueeze(-3), others.unsqueeze(-3))            # i's own obs, the others' (o, a)
        baseline = self.baseline_head(self._attend(rows.reshape(-1, A, obs.shape[-1]), visible.reshape(-1, A)))
        return value, baseline.reshape(*lead, A)

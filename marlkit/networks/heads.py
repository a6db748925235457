"""Value heads that read one value per agent."""
from __future__ import annotations

import torch
from torch import nn

from marlkit.networks.base import ACTIVATIONS, init_linear


class SharedValueHead(nn.Module):
    """Values ``[L, B, A]`` of a group's ``A`` agents from one input they share (the global state),
    so that the costly part of the encoder runs once per env step, not once per agent.

    With agent ids and an encoder that ``takes_ids`` (``mlp``), the encoder is built for
    ``[state, one-hot id]`` and computes its first layer, the one whose size grows with the state,
    once per env step for all ids (``ids_in_encoder``): it gives ``[L, B, A, F]`` and ``forward``
    reads them out. With other encoders (``cnn``, ``gru``), a hidden layer on ``[features, one-hot id]``
    after the encoding ``[L, B, F]`` tells the agents apart: its id part is a learned per-agent
    bias, so the layer costs one ``F x F`` product per env step plus ``A`` additions. Without ids,
    all agents share one linear readout.
    """

    def __init__(self, in_dim: int, n_agents: int, use_agent_id: bool, activation: str = "relu",
                 ids_in_encoder: bool = False):
        super().__init__()
        self.n_agents = n_agents
        self.use_agent_id = use_agent_id
        self.ids_in_encoder = use_agent_id and ids_in_encoder
        if use_agent_id and not ids_in_encoder:
            joint = init_linear(nn.Linear(in_dim + n_agents, in_dim))  # initialised as one layer on [features, id]
            self.proj = nn.Linear(in_dim, in_dim)
            with torch.no_grad():
                self.proj.weight.copy_(joint.weight[:, :in_dim])
                self.proj.bias.copy_(joint.bias)
            self.agent_bias = nn.Parameter(joint.weight[:, in_dim:].T.detach().clone())   # [A, F]
            self.act = ACTIVATIONS[activation]()
        self.out = init_linear(nn.Linear(in_dim, 1), gain=1.0)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``[L, B, F]``, or ``[L, B, A, F]`` (per agent: ``ids_in_encoder``, or a recurrent encoder
        with one memory per agent) -> ``[L, B, A]``."""
        per_agent = features.dim() == 4
        if self.use_agent_id and not self.ids_in_encoder:
            projected = self.proj(features)
            hidden = self.act((projected if per_agent else projected.unsqueeze(-2)) + self.agent_bias)
            return self.out(hidden).squeeze(-1)
        if per_agent:
            return self.out(features).squeeze(-1)
        return self.out(features).expand(*features.shape[:-1], self.n_agents)

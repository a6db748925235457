"""The encoder interface every registered model implements.

Encoders map inputs ``[L, B, *input_shape]`` (L = time steps of a training chunk, 1 when acting)
to features ``[L, B, out_dim]``. Recurrent encoders also take and return a hidden state
``[B, hidden_size]`` and reset it where ``episode_start`` ``[L, B]`` is True.

An encoder with ``takes_agent_bias`` can read one input for ``A`` agents at the cost of one: its
first layer runs once, then ``agent_bias`` ``[A, bias_width]`` (one learned vector per agent, what
a one-hot id appended to the input would add) splits it into ``A`` rows for the remaining layers,
giving features ``[L, B, A, out_dim]``.
"""
from __future__ import annotations

import math

import torch
from torch import nn

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU, "elu": nn.ELU}


def init_linear(layer: nn.Linear, gain: float = math.sqrt(2)) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class Encoder(nn.Module):
    is_recurrent = False
    hidden_size = 0
    takes_agent_bias = False
    bias_width = 0
    out_dim: int

    def encode(self, x: torch.Tensor, agent_bias: torch.Tensor | None = None) -> torch.Tensor:
        """``[N, *input_shape]`` -> ``[N, out_dim]``, or ``[N, A, out_dim]`` with ``agent_bias``
        (feed-forward encoders implement this)."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor, hidden: torch.Tensor | None = None, episode_start: torch.Tensor | None = None,
                agent_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        lead = x.shape[:2]
        flat = x.reshape(-1, *x.shape[2:])
        if agent_bias is None:
            return self.encode(flat).reshape(*lead, -1), hidden
        return self.encode(flat, agent_bias).reshape(*lead, len(agent_bias), -1), hidden

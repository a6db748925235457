from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from marlkit.config import ModelConfig
from marlkit.networks.base import ACTIVATIONS, Encoder, init_linear
from marlkit.registry import register_model


def mlp_layers(in_dim: int, cfg: ModelConfig) -> tuple[nn.Sequential, int]:
    """Input LayerNorm (MAPPO's feature normalisation), then Linear -> activation [-> LayerNorm]."""
    layers: list[nn.Module] = [nn.LayerNorm(in_dim)] if cfg.layer_norm else []
    for size in cfg.hidden_sizes:
        layers += [init_linear(nn.Linear(in_dim, size), math.sqrt(2)), ACTIVATIONS[cfg.activation]()]
        if cfg.layer_norm:
            layers.append(nn.LayerNorm(size))
        in_dim = size
    return nn.Sequential(*layers), in_dim


def flat_size(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64))


@register_model("mlp")
class MLP(Encoder):
    """Fully connected encoder; inputs of any shape (``(27, 5)``, an image) are flattened. An
    ``agent_bias`` joins after the first linear layer (see ``Encoder``)."""

    def __init__(self, input_shape: tuple[int, ...], cfg: ModelConfig):
        super().__init__()
        self.net, self.out_dim = mlp_layers(flat_size(input_shape), cfg)
        linear = [i for i, layer in enumerate(self.net) if isinstance(layer, nn.Linear)]
        self.takes_agent_bias = bool(linear)
        self._bias_at = linear[0] + 1 if linear else 0
        self.bias_width = cfg.hidden_sizes[0] if linear else 0

    def encode(self, x: torch.Tensor, agent_bias: torch.Tensor | None = None) -> torch.Tensor:
        x = x.reshape(x.shape[0], -1).float()
        if agent_bias is None:
            return self.net(x)
        for i, layer in enumerate(self.net):
            if i == self._bias_at:
                x = x.unsqueeze(-2) + agent_bias
            x = layer(x)
        return x

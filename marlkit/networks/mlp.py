from __future__ import annotations

import math

import torch
from torch import nn

from marlkit.config import ConfigError, ModelConfig
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


@register_model("mlp")
class MLP(Encoder):
    """Fully connected encoder for flat observations."""

    def __init__(self, input_shape: tuple[int, ...], cfg: ModelConfig):
        super().__init__()
        if len(input_shape) != 1:
            raise ConfigError(f"model 'mlp' needs flat observations, got shape {input_shape}; "
                              "use model name 'cnn' for images")
        self.net, self.out_dim = mlp_layers(int(input_shape[0]), cfg)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.float())

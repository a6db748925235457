from __future__ import annotations

import torch
from torch import nn

from marlkit.config import ConfigError, ModelConfig
from marlkit.networks.base import ACTIVATIONS, Encoder, init_linear
from marlkit.registry import register_model


@register_model("cnn")
class CNN(Encoder):
    """Nature-DQN style convolutions for image observations ``[C, H, W]`` (or ``[H, W, C]`` with
    ``kwargs: {channels_last: true}``); uint8 pixels are scaled to [0, 1]."""

    def __init__(self, input_shape: tuple[int, ...], cfg: ModelConfig):
        super().__init__()
        if len(input_shape) != 3:
            raise ConfigError(f"model 'cnn' needs image observations [C, H, W], got shape {input_shape}")
        self.channels_last = bool(cfg.kwargs.get("channels_last", False))
        c = input_shape[2] if self.channels_last else input_shape[0]
        act = ACTIVATIONS[cfg.activation]
        self.conv = nn.Sequential(
            nn.Conv2d(c, 32, 8, stride=4), act(), nn.Conv2d(32, 64, 4, stride=2), act(),
            nn.Conv2d(64, 64, 3, stride=1), act(), nn.Flatten())
        with torch.no_grad():
            probe = torch.zeros(1, *input_shape)
            flat = self.conv(self._chw(probe)).shape[1]
        width = cfg.hidden_sizes[-1] if cfg.hidden_sizes else 512
        self.head = nn.Sequential(init_linear(nn.Linear(flat, width)), act())
        self.out_dim = width

    def _chw(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, 3, 1, 2) if self.channels_last else x

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
        return self.head(self.conv(self._chw(x)))

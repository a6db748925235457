from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from torch import nn

from marlkit.config import ConfigError, ModelConfig
from marlkit.networks.base import Encoder
from marlkit.networks.cnn import CNN
from marlkit.networks.mlp import mlp_layers
from marlkit.registry import register_model


@register_model("mixed")
class Mixed(Encoder):
    """Images and a vector in one flat observation: the leading values are images of the shapes in
    ``kwargs.images`` (``[[C, H, W], ...]``, in order), the rest a vector (with the agent id, when
    the agent appends it). Each image goes through the packaged ``cnn``, the vector through an
    ``mlp``; their features are concatenated. Unity behaviours with image and vector sensors give
    such observations (image sensors first, channels first), and their spec says so: the agent
    fills ``images`` and ``channels_last`` in from it, so neither needs setting by hand.
    """

    spec_kwargs = ("channels_last", "images")
    update_bound = True   # each image goes through the packaged cnn

    def __init__(self, input_shape: tuple[int, ...], cfg: ModelConfig):
        super().__init__()
        images = [tuple(int(n) for n in shape) for shape in cfg.kwargs.get("images") or []]
        if len(input_shape) != 1 or not images:
            raise ConfigError(f"model 'mixed' takes flat inputs whose leading values are images, with their shapes "
                              f"in kwargs.images (e.g. [[3, 84, 84]]; filled in by itself for envs that declare "
                              f"their sensors); got input shape {tuple(input_shape)} and "
                              f"kwargs.images={cfg.kwargs.get('images')!r}")
        self.images = images
        self.sizes = [int(np.prod(shape)) for shape in images]
        rest = int(input_shape[0]) - sum(self.sizes)
        if rest < 0:
            raise ConfigError(f"model 'mixed': kwargs.images {[list(s) for s in images]} hold {sum(self.sizes)} "
                              f"values, more than the {input_shape[0]} of its input")
        image_cfg = replace(cfg, kwargs={k: v for k, v in cfg.kwargs.items() if k != "images"})
        self.cnns = nn.ModuleList(CNN(shape, image_cfg) for shape in images)
        self.vector, vector_dim = mlp_layers(rest, cfg) if rest else (None, 0)
        self.rest = rest
        self.out_dim = sum(cnn.out_dim for cnn in self.cnns) + vector_dim

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.split(x.float(), self.sizes + [self.rest], 1)
        features = [cnn.encode(part.reshape(len(part), *shape))
                    for cnn, part, shape in zip(self.cnns, parts, self.images)]
        if self.vector is not None:
            features.append(self.vector(parts[-1]))
        return torch.cat(features, -1)

from __future__ import annotations

import itertools
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from marlkit.config import ModelConfig
from marlkit.networks.base import ACTIVATIONS, Encoder, as_float, init_linear
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
    """Fully connected encoder; inputs of any shape (``(27, 5)``, an image) are flattened. Takes
    ids (see ``Encoder``): the first layer is computed once for all ids."""

    takes_ids = True
    # below this many input values times ids, copying the input once per id is faster than the
    # shared first layer's dozen extra small ops (a batch of 400, forward and backward, one core)
    share_ids_from = 1024

    def __init__(self, input_shape: tuple[int, ...], cfg: ModelConfig):
        super().__init__()
        self.net, self.out_dim = mlp_layers(flat_size(input_shape), cfg)
        linear = [i for i, layer in enumerate(self.net) if isinstance(layer, nn.Linear)]
        self._first = linear[0] if linear else None

    def encode(self, x: torch.Tensor, n_ids: int = 0) -> torch.Tensor:
        x = as_float(x.flatten(1))
        if not n_ids:
            return self._forward(x)
        if self._first is None or x.shape[-1] * n_ids < self.share_ids_from:
            ids = torch.eye(n_ids, device=x.device).expand(len(x), -1, -1)
            return self._forward(torch.cat([x.unsqueeze(1).expand(-1, n_ids, -1), ids], -1))
        return self._layers_from(self._first + 1, self._first_layer_with_ids(x, n_ids))

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """``net``, with the input LayerNorm's gain and shift folded into the first Linear's weight
        and bias: the same function, but the backward then needs the gradient of that Linear's
        weight alone, not of its input, the widest product of the backward where observations are
        wide (a 13x13x5 view: 1.1 of 4.5 MFLOP per agent step of training)."""
        if self._first != 1:
            return self.net(x)
        norm, linear = self.net[0], self.net[1]
        normalised = F.layer_norm(x, norm.normalized_shape, None, None, norm.eps)
        first = F.linear(normalised, linear.weight * norm.weight, torch.addmv(linear.bias, linear.weight, norm.bias))
        return self._layers_from(2, first)

    def _layers_from(self, start: int, x: torch.Tensor) -> torch.Tensor:
        """``net``'s layers from index ``start`` on, applied to ``x``; a slice of ``net`` would build a
        new ``nn.Sequential`` per call, a tenth of a small policy's acting time."""
        for layer in itertools.islice(self.net, start, None):
            x = layer(x)
        return x

    def _first_layer_with_ids(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """The input LayerNorm and first Linear of ``[x, one-hot(i)]`` for every ``i < n`` ->
        ``[N, n, width]``, from ``x`` ``[N, S]`` alone: a one-hot adds the same values to every
        row's statistics (one 1, n - 1 zeros), so the normalisation is shared by all ids, and the
        Linear of the id part is one weight column per id. Costs one ``S x width`` product, not n."""
        linear = self.net[self._first]
        S = x.shape[-1]
        w_x, w_id = linear.weight[:, :S], linear.weight[:, S:]          # [F, S], [F, n]
        if self._first == 0:
            return (x @ w_x.T + linear.bias).unsqueeze(1) + w_id.T
        norm = self.net[0]
        gain_x, gain_id = norm.weight[:S], norm.weight[S:]
        shift_x, shift_id = norm.bias[:S], norm.bias[S:]
        mean = (x.sum(-1, keepdim=True) + 1.0) / (S + n)                 # [N, 1]
        centred = x - mean
        sq = (centred * centred).sum(-1, keepdim=True) + (1.0 - mean) ** 2 + (n - 1) * mean * mean
        rstd = torch.rsqrt(sq / (S + n) + norm.eps)
        shared_id = (-mean * rstd) * gain_id + shift_id                  # [N, n]: every id slot as a 0
        # the gain folded into the weight, as in _forward: no gradient of the [N, S] input is needed
        shared = (centred * rstd) @ (w_x * gain_x).T + (shift_x @ w_x.T + shared_id @ w_id.T + linear.bias)  # [N, F]
        hot = (rstd * gain_id).unsqueeze(-1) * w_id.T                    # [N, n, F]: the 1 of id i
        return shared.unsqueeze(1) + hot

"""The encoder interface every registered model implements.

Encoders map inputs ``[L, B, *input_shape]`` (L = time steps of a training chunk, 1 when acting)
to features ``[L, B, out_dim]``. Recurrent encoders also take and return a hidden state
``[B, hidden_size]`` and reset it where ``episode_start`` ``[L, B]`` is True; with ``copies=n`` one
input is read by ``n`` memories (one per agent of a critic on the global state): hidden
``[B * n, hidden_size]``, ``episode_start`` ``[L, B * n]``, features ``[L, B, n, out_dim]``.

An encoder with ``takes_ids``, built for flat inputs with an ``n``-way one-hot id appended,
can be given the input alone and ``n_ids=n``: it returns features ``[L, B, n, out_dim]``, those
of the input with each id appended, without building the ``n`` copies of the input (what a
critic on the global state plus the agent id needs, once per env step instead of once per agent).
"""
from __future__ import annotations

import math

import torch
from torch import nn

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU, "elu": nn.ELU}


def as_float(x: torch.Tensor, pixels: torch.dtype = torch.float32) -> torch.Tensor:
    """Model inputs as float32, but uint8 pixels as ``pixels`` (float32 unless the caller runs under
    autocast), scaled to [0, 1] in place of their fresh copy (one tensor made, not two: 0.6 of the
    time for a batch of images)."""
    return x.to(pixels).mul_(1.0 / 255.0) if x.dtype == torch.uint8 else x.float()


def init_linear(layer: nn.Linear, gain: float = math.sqrt(2)) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class Encoder(nn.Module):
    is_recurrent = False
    hidden_size = 0
    takes_ids = False
    # ``kwargs`` keys the agent fills in from the env's spec unless the config sets them:
    # ``channels_last`` (the declared image layout), ``images`` (the image parts of a flat observation)
    spec_kwargs: tuple[str, ...] = ()
    # convolutions: on a CPU their update costs more time per sample than collecting it, so a run
    # that learns with one updates on 2 threads with nothing beside it, unless its config says
    # otherwise (RunnerConfig.settle_update_bound; measured in docs/benchmarks.md)
    update_bound = False
    out_dim: int

    @property
    def trunk_dim(self) -> int:
        """The width of the features a critic reads when it shares this encoder (MAPPO's
        ``critic_encoder: actor``): a feed-forward encoder's output; a recurrent one's feed-forward
        trunk, where it has one (``trunk``)."""
        return self.out_dim

    @classmethod
    def bounds_the_update(cls, cfg) -> bool:
        """Whether this model, built with ``cfg`` (a ModelConfig), has ``update_bound`` parts."""
        return cls.update_bound

    def encode(self, x: torch.Tensor, n_ids: int = 0) -> torch.Tensor:
        """``[N, *input_shape]`` -> ``[N, out_dim]``, or ``[N, n_ids, out_dim]`` (see ``takes_ids``)
        (feed-forward encoders implement this)."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor, hidden: torch.Tensor | None = None, episode_start: torch.Tensor | None = None,
                n_ids: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
        lead = x.shape[:2]
        flat = x.reshape(-1, *x.shape[2:])
        if not n_ids:
            return self.encode(flat).reshape(*lead, -1), hidden
        return self.encode(flat, n_ids).reshape(*lead, n_ids, -1), hidden

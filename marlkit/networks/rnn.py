from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from marlkit.config import ConfigError, ModelConfig
from marlkit.networks.base import Encoder, as_float
from marlkit.networks.mlp import flat_size, mlp_layers
from marlkit.errors import UnknownNameError
from marlkit.registry import get_model, register_model


@register_model("gru")
class GRU(Encoder):
    """A feed-forward encoder, then a GRU; the hidden state resets where an episode starts, and the
    steps between two starts go through the GRU in one call.

    The encoder is MLP layers (inputs flattened) by default, or any feed-forward registered model
    named by ``kwargs.encoder`` (``cnn`` for pixels: ``{name: gru, kwargs: {encoder: cnn}}``), built
    with the same settings and the other kwargs. It is the model's feed-forward trunk (``trunk``,
    ``trunk_dim`` wide), which a critic may read too (MAPPO's ``critic_encoder: actor``); ``recur``
    runs the GRU over its features.
    """

    is_recurrent = True
    spec_kwargs = ("channels_last", "images")   # handed on to the encoder, which may take them

    @classmethod
    def bounds_the_update(cls, cfg: ModelConfig) -> bool:
        return get_model(cfg.kwargs.get("encoder", "mlp")).bounds_the_update(cfg)

    def __init__(self, input_shape: tuple[int, ...], cfg: ModelConfig):
        super().__init__()
        name = cfg.kwargs.get("encoder", "mlp")
        self.flat = name == "mlp"   # the MLP layers stay this module's own (checkpoints of a plain gru)
        if self.flat:
            self.mlp, width = mlp_layers(flat_size(input_shape), cfg)
        else:
            try:
                cls = get_model(name)
            except UnknownNameError as exc:
                raise ConfigError(f"model 'gru': kwargs.encoder: {exc}") from None
            if cls.is_recurrent:
                raise ConfigError(f"model 'gru': kwargs.encoder {name!r} is recurrent itself; name a feed-forward "
                                  "model such as 'mlp' or 'cnn'")
            kept = {k: v for k, v in cfg.kwargs.items() if k != "encoder" and (k in cls.spec_kwargs or
                                                                                 k not in self.spec_kwargs)}
            self.encoder = cls(tuple(input_shape), replace(cfg, name=name, kwargs=kept))
            width = self.encoder.out_dim
        self.gru = nn.GRU(width, cfg.rnn_hidden)
        for name, param in self.gru.named_parameters():
            if "weight" in name:
                nn.init.orthogonal_(param)
            else:
                nn.init.zeros_(param)
        self.norm = nn.LayerNorm(cfg.rnn_hidden) if cfg.layer_norm else nn.Identity()
        self.hidden_size = self.out_dim = cfg.rnn_hidden
        self._trunk_width = width

    @property
    def trunk_dim(self) -> int:
        return self._trunk_width

    def trunk(self, x: torch.Tensor) -> torch.Tensor:
        """The feed-forward part: inputs ``[L, B, ...]`` -> features ``[L, B, trunk_dim]``."""
        length, batch = x.shape[:2]
        if self.flat:
            z = self.mlp(as_float(x.reshape(length * batch, -1)))
        else:
            z = self.encoder.encode(x.reshape(length * batch, *x.shape[2:]))
        return z.reshape(length, batch, -1)

    def forward(self, x, hidden=None, episode_start=None, copies: int = 0):
        """``copies=n``: the input ``[L, B, ...]`` is read by ``n`` memories each (hidden ``[B * n, H]``,
        ``episode_start`` ``[L, B * n]``), encoded once -> features ``[L, B, n, H]``."""
        return self.recur(self.trunk(x), hidden, episode_start, copies)

    def recur(self, z: torch.Tensor, hidden=None, episode_start=None, copies: int = 0):
        """The GRU over the trunk's features ``z`` ``[L, B, trunk_dim]`` (see ``forward``)."""
        length, batch = z.shape[:2]
        if copies:
            z = z.unsqueeze(2).expand(-1, -1, copies, -1).reshape(length, batch * copies, -1)
            batch *= copies
        h = torch.zeros(batch, self.hidden_size, device=z.device) if hidden is None else hidden
        # one GRU call over each stretch of steps in which no episode starts: the memory resets only
        # where one does (a start at the first step is the caller's, in ``hidden``)
        starts = [] if episode_start is None else (torch.nonzero(episode_start[1:].any(-1)).flatten() + 1).tolist()
        outputs = []
        for first, end in zip([0, *starts], [*starts, length]):
            if first > 0:
                h = h * (~episode_start[first]).unsqueeze(-1).to(h.dtype)
            out, h_seq = self.gru(z[first:end], h.unsqueeze(0).contiguous())
            h = h_seq.squeeze(0)
            outputs.append(out)
        features = self.norm(outputs[0] if len(outputs) == 1 else torch.cat(outputs, 0))
        return (features.reshape(length, -1, copies, self.hidden_size) if copies else features), h

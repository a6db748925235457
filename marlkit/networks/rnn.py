from __future__ import annotations

import torch
from torch import nn

from marlkit.config import ModelConfig
from marlkit.networks.base import Encoder
from marlkit.networks.mlp import flat_size, mlp_layers
from marlkit.registry import register_model


@register_model("gru")
class GRU(Encoder):
    """MLP layers (inputs flattened) then a GRU; the hidden state resets where an episode starts."""

    is_recurrent = True

    def __init__(self, input_shape: tuple[int, ...], cfg: ModelConfig):
        super().__init__()
        self.mlp, width = mlp_layers(flat_size(input_shape), cfg)
        self.gru = nn.GRU(width, cfg.rnn_hidden)
        for name, param in self.gru.named_parameters():
            if "weight" in name:
                nn.init.orthogonal_(param)
            else:
                nn.init.zeros_(param)
        self.norm = nn.LayerNorm(cfg.rnn_hidden) if cfg.layer_norm else nn.Identity()
        self.hidden_size = self.out_dim = cfg.rnn_hidden

    def forward(self, x, hidden=None, episode_start=None):
        length, batch = x.shape[:2]
        z = self.mlp(x.reshape(length * batch, -1).float()).reshape(length, batch, -1)
        h = torch.zeros(batch, self.hidden_size, device=x.device) if hidden is None else hidden
        outputs = []
        for t in range(length):
            if episode_start is not None and t > 0:
                h = h * (~episode_start[t]).unsqueeze(-1).to(h.dtype)
            out, h_seq = self.gru(z[t:t + 1], h.unsqueeze(0).contiguous())
            h = h_seq.squeeze(0)
            outputs.append(out)
        return self.norm(torch.cat(outputs, 0)), h

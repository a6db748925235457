"""Team mixers: the agents' Q-values of one step ``[L, B, A]`` -> the team's Q ``[L, B]``.

Absent agents (``present`` False: dead, not yet spawned) are left out of the mix: their Q-values
are replaced by zeros, which add nothing to VDN's sum and meet QMIX's first layer with nothing.
"""
from __future__ import annotations

import torch
from torch import nn


class VDNMixer(nn.Module):
    """Q_tot = the sum of the present agents' Q-values (Sunehag et al., 2018)."""

    def forward(self, q: torch.Tensor, state: torch.Tensor | None, present: torch.Tensor) -> torch.Tensor:
        return torch.where(present, q, 0.0).sum(-1)


class QMixer(nn.Module):
    """QMIX's monotonic mixer (Rashid et al., 2018): a two-layer network over the agents' Q-values
    whose weights come out of hypernetworks of the global state, made non-negative (absolute
    values), so that Q_tot grows with every agent's Q and each agent's greedy action is the team's.

    ``hypernet_layers`` 1 or 2 (EPyMARL's default 2, with ``hypernet_embed`` hidden units), the
    mixing layer ``embed_dim`` wide; the state is flattened, and with ``state_norm`` normalised
    (zero mean, unit variance over its features, as a LayerNorm without gain) before the
    hypernetworks read it: a state that grows without bound (MPE's positions) otherwise grows the
    mixing weights with it, and the team's Q diverges where bootstrapping never ends."""

    def __init__(self, state_dim: int, n_agents: int, embed_dim: int = 32, hypernet_layers: int = 2,
                 hypernet_embed: int = 64, state_norm: bool = False):
        super().__init__()
        self.n_agents, self.embed_dim = n_agents, embed_dim
        self.state_norm = nn.LayerNorm(state_dim, elementwise_affine=False) if state_norm else nn.Identity()

        def hyper(out: int) -> nn.Module:
            if hypernet_layers == 1:
                return nn.Linear(state_dim, out)
            return nn.Sequential(nn.Linear(state_dim, hypernet_embed), nn.ReLU(), nn.Linear(hypernet_embed, out))

        self.hyper_w1 = hyper(n_agents * embed_dim)
        self.hyper_w2 = hyper(embed_dim)
        self.hyper_b1 = nn.Linear(state_dim, embed_dim)
        self.hyper_b2 = nn.Sequential(nn.Linear(state_dim, embed_dim), nn.ReLU(), nn.Linear(embed_dim, 1))

    def forward(self, q: torch.Tensor, state: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        lead = q.shape[:-1]
        s = self.state_norm(state.reshape(*lead, -1).float())
        q = torch.where(present, q, 0.0).unsqueeze(-2)                                   # [..., 1, A]
        w1 = self.hyper_w1(s).abs().reshape(*lead, self.n_agents, self.embed_dim)        # [..., A, E]
        hidden = nn.functional.elu(q @ w1 + self.hyper_b1(s).unsqueeze(-2))             # [..., 1, E]
        w2 = self.hyper_w2(s).abs().unsqueeze(-1)                                        # [..., E, 1]
        return (hidden @ w2).reshape(lead) + self.hyper_b2(s).squeeze(-1)

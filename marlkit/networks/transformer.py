"""The Multi-Agent Transformer's networks (Wen et al., 2022): an encoder over the observations of
all agents of a group and a causal decoder over their actions.

Tensors are ``[N, A, ...]`` (batch, agent) inside; the agent axis is the sequence. There are no
position embeddings (as in the paper): the weights do not depend on the number of agents, so one
network serves a group of any size, and agents are told apart by their observations and, in the
decoder, by their place in the decoding order.

The decoder runs two ways that compute the same function: ``forward`` on all positions at once
(teacher forcing, for training) and ``step`` one position at a time with a cache of the keys and
values of the positions before (acting), so that decoding ``A`` agents costs ``A`` single-position
passes rather than ``A`` passes over the whole sequence.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from marlkit.networks.base import init_linear

# the paper's initialisation: orthogonal, gain sqrt(2) before a GELU, 0.01 elsewhere
RELU_GAIN, SMALL_GAIN = math.sqrt(2), 0.01


class Attention(nn.Module):
    """Multi-head attention with separate query and key/value inputs. The query, key and value
    projections are one ``[3D, D]`` weight (each block initialised as its own layer), so that
    self-attention projects with one product and cross-attention with two."""

    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.n_head, self.n_embd = n_head, n_embd
        self.in_proj = nn.Linear(n_embd, 3 * n_embd)
        for block in self.in_proj.weight.split(n_embd):
            nn.init.orthogonal_(block, SMALL_GAIN)
        nn.init.zeros_(self.in_proj.bias)
        self.proj = init_linear(nn.Linear(n_embd, n_embd), SMALL_GAIN)

    def heads(self, x: torch.Tensor, parts: int) -> list[torch.Tensor]:
        """``[N, L, parts * D]`` -> ``parts`` tensors ``[N, H, L, D / H]``."""
        N, L, _ = x.shape
        return list(x.view(N, L, parts * self.n_head, -1).transpose(1, 2).split(self.n_head, 1))

    def project_query(self, x: torch.Tensor) -> torch.Tensor:
        """The query heads ``[N, H, L, D / H]`` of ``x`` ``[N, L, D]``."""
        D = self.n_embd
        return self.heads(F.linear(x, self.in_proj.weight[:D], self.in_proj.bias[:D]), 1)[0]

    def project_kv(self, x: torch.Tensor) -> list[torch.Tensor]:
        D = self.n_embd
        return self.heads(F.linear(x, self.in_proj.weight[D:], self.in_proj.bias[D:]), 2)

    def merge(self, y: torch.Tensor) -> torch.Tensor:
        N, H, L, d = y.shape
        return self.proj(y.transpose(1, 2).reshape(N, L, H * d))

    def forward(self, query: torch.Tensor, keys: torch.Tensor, allowed: torch.Tensor | None = None,
                causal: bool = False) -> torch.Tensor:
        """``allowed`` ``[N, Lq, Lk]`` bool (True = may attend), or ``causal``: position i attends
        to positions ``0..i``."""
        if causal:
            L = query.shape[1]
            allowed = torch.ones(L, L, dtype=torch.bool, device=query.device).tril()
        elif allowed is not None:
            allowed = allowed.unsqueeze(1)
        if query is keys:
            q, k, v = self.heads(self.in_proj(query), 3)
        else:
            q, (k, v) = self.project_query(query), self.project_kv(keys)
        return self.merge(attend(q, k, v, allowed))

    def step(self, query: torch.Tensor | None, key: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor],
             p: int, q: torch.Tensor | None = None) -> torch.Tensor:
        """One position ``p`` of causal attention: ``key`` ``[N, 1, D]``, and ``query`` ``[N, 1, D]``
        (None: ``key`` is the query too) or its heads ``q`` already projected. The key and value
        are written into ``cache`` (two ``[N, H, A, D / H]``) at ``p``, then the query attends to
        positions ``0..p``."""
        keys, values = cache
        if query is None and q is None:
            q, keys[:, :, p:p + 1], values[:, :, p:p + 1] = self.heads(self.in_proj(key), 3)
        else:
            keys[:, :, p:p + 1], values[:, :, p:p + 1] = self.project_kv(key)
            q = q if q is not None else self.project_query(query)
        return self.merge(attend(q, keys[:, :, :p + 1], values[:, :, :p + 1]))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Scaled dot-product attention written out: over a handful of agents it is several times
    faster on CPU than ``F.scaled_dot_product_attention``, whose kernels are tuned for long sequences."""
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, -1) @ v


def _mlp(n_embd: int) -> nn.Sequential:
    return nn.Sequential(init_linear(nn.Linear(n_embd, n_embd), RELU_GAIN), nn.GELU(),
                         init_linear(nn.Linear(n_embd, n_embd), SMALL_GAIN))


class EncodeBlock(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.attn, self.mlp = Attention(n_embd, n_head), _mlp(n_embd)
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)

    def forward(self, x, allowed):
        x = self.ln1(x + self.attn(x, x, allowed))
        return self.ln2(x + self.mlp(x))


class DecodeBlock(nn.Module):
    """Causal self-attention over the decoder's stream, then each agent's observation
    representation attends (causally) to the result, then an MLP (the paper's block)."""

    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.self_attn, self.cross_attn, self.mlp = Attention(n_embd, n_head), Attention(n_embd, n_head), _mlp(n_embd)
        self.ln1, self.ln2, self.ln3 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)

    def forward(self, x, rep):
        x = self.ln1(x + self.self_attn(x, x, causal=True))
        x = self.ln2(rep + self.cross_attn(rep, x, causal=True))
        return self.ln3(x + self.mlp(x))

    def step(self, x, rep, rep_query, cache, p: int):
        """``x``, ``rep`` ``[N, 1, E]`` at position ``p``, ``rep_query`` the cross-attention's query
        heads of ``rep``; ``cache`` holds this block's four tensors."""
        x = self.ln1(x + self.self_attn.step(None, x, cache[0:2], p))
        x = self.ln2(rep + self.cross_attn.step(None, x, cache[2:4], p, q=rep_query))
        return self.ln3(x + self.mlp(x))


class MATEncoder(nn.Module):
    """Observations ``[N, A, D]`` of the agents ``present`` ``[N, A]`` -> (normalised values
    ``[N, A]``, representations ``[N, A, E]``). A present agent attends to the present agents
    only, so an absent one influences nobody; an absent one attends to itself alone (a row with
    nothing to attend to would be NaN), and its outputs mean nothing."""

    def __init__(self, obs_dim: int, n_block: int, n_embd: int, n_head: int):
        super().__init__()
        self.embed = nn.Sequential(nn.LayerNorm(obs_dim), init_linear(nn.Linear(obs_dim, n_embd), RELU_GAIN),
                                   nn.GELU())
        self.ln = nn.LayerNorm(n_embd)
        self.blocks = nn.ModuleList(EncodeBlock(n_embd, n_head) for _ in range(n_block))
        self.value_head = nn.Sequential(init_linear(nn.Linear(n_embd, n_embd), RELU_GAIN), nn.GELU(),
                                        nn.LayerNorm(n_embd), init_linear(nn.Linear(n_embd, 1), SMALL_GAIN))

    def forward(self, obs: torch.Tensor, present: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        A = obs.shape[1]
        allowed = present.unsqueeze(1) | torch.eye(A, dtype=torch.bool, device=obs.device)
        x = self.ln(self.embed(obs))
        for block in self.blocks:
            x = block(x, allowed)
        return self.value_head(x).squeeze(-1), x


class MATDecoder(nn.Module):
    """Action tokens ``[N, A, token_dim]`` (position 0 the start token, position i the token of the
    action of the agent decoded at i-1) and representations ``[N, A, E]`` in decoding order ->
    features ``[N, A, E]``; position i depends on the tokens ``0..i`` and representations ``0..i``
    only, i.e. on the actions of the agents decoded before it, never on its own or later ones."""

    def __init__(self, token_dim: int, n_block: int, n_embd: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        embed = nn.Linear(token_dim, n_embd, bias=False)   # no bias: the no-action token embeds to 0
        nn.init.orthogonal_(embed.weight, RELU_GAIN)
        self.embed = nn.Sequential(embed, nn.GELU())
        self.ln = nn.LayerNorm(n_embd)
        self.blocks = nn.ModuleList(DecodeBlock(n_embd, n_head) for _ in range(n_block))
        # the paper's head up to its last linear layer, which is the action head's
        self.head = nn.Sequential(init_linear(nn.Linear(n_embd, n_embd), RELU_GAIN), nn.GELU(), nn.LayerNorm(n_embd))

    def forward(self, tokens: torch.Tensor, rep: torch.Tensor) -> torch.Tensor:
        x = self.ln(self.embed(tokens))
        for block in self.blocks:
            x = block(x, rep)
        return self.head(x)

    def start(self, rep: torch.Tensor) -> dict:
        """State of a sequential decoding over representations ``rep`` ``[N, A, E]``: per block the
        keys and values of the positions decoded so far (self- and cross-attention), and the
        cross-attention queries of all positions, projected once."""
        N, A, E = rep.shape
        shape = (N, self.n_head, A, E // self.n_head)
        return {"rep": rep, "queries": [block.cross_attn.project_query(rep) for block in self.blocks],
                "cache": [[rep.new_empty(shape) for _ in range(4)] for _ in self.blocks]}

    def step(self, token: torch.Tensor, state: dict, p: int) -> torch.Tensor:
        """Position ``p`` alone: ``token`` ``[N, token_dim]`` -> features ``[N, E]``, equal to
        ``forward(...)[:, p]`` once positions ``0..p-1`` went through ``step`` with the same state."""
        x = self.ln(self.embed(token.unsqueeze(1)))
        rep = state["rep"][:, p:p + 1]
        for block, q, cache in zip(self.blocks, state["queries"], state["cache"]):
            x = block.step(x, rep, q[:, :, p:p + 1], cache, p)
        return self.head(x).squeeze(1)


class ActionTokens:
    """Actions of one agent as decoder input: ``[start flag, one-hot per branch]`` for Discrete and
    MultiDiscrete, ``[start flag, action]`` for Box. An absent agent's token is all zeros: a fixed
    no-action token that says nothing about what its slot holds."""

    def __init__(self, nvec: list[int] | None, box_dim: int = 0):
        self.nvec, self.box_dim = nvec, box_dim
        self.dim = 1 + (sum(nvec) if nvec else box_dim)

    def start(self, n: int, like: torch.Tensor) -> torch.Tensor:
        """``[n, dim]``: the start token, which opens every sequence."""
        token = like.new_zeros(n, self.dim)
        token[:, 0] = 1.0
        return token

    def __call__(self, actions: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        """``actions [..., (branches or box_dim)]``, ``present [...]`` -> tokens ``[..., dim]``."""
        if self.nvec is None:
            body = actions.float()
        else:
            branches = torch.where(present.unsqueeze(-1), actions.long().reshape(*present.shape, len(self.nvec)), 0)
            body = torch.cat([F.one_hot(branches[..., i], n).float() for i, n in enumerate(self.nvec)], -1)
        body = torch.cat([torch.zeros_like(body[..., :1]), body], -1)
        return torch.where(present.unsqueeze(-1), body, 0.0)

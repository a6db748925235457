"""COMA's centralised critic Q(s, u^-a, .): one Q-value per action of agent a, for every agent of a
group in one batched pass (Foerster et al., 2018).

Agent a's input is ``[global state, a's observation, the other agents' actions as one-hots, a's
one-hot id]``; a's own action is left out (its slot is zeros), so a single pass gives Q for every
action a could have taken while the others keep theirs: the counterfactual the baseline needs.
An absent agent's action enters nobody's input (its one-hot is zeros), so whatever sits in its
slot cannot move a present agent's Q.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from marlkit.networks.base import Encoder, init_linear


class COMACritic(nn.Module):
    """``encoder`` is any feed-forward registered model built for flat inputs of ``input_dim(...)``."""

    def __init__(self, encoder: Encoder, n_agents: int, n_actions: int):
        super().__init__()
        self.encoder, self.n_agents, self.n_actions = encoder, n_agents, n_actions
        # near-equal Q-values across actions at the start: an untrained critic must not make one
        # action look better than the rest, or the actors follow that noise before it is learnt away
        self.head = init_linear(nn.Linear(encoder.out_dim, n_actions), gain=0.01)
        # others[a] keeps the action one-hots of every agent but a: [A, A * n_actions]
        others = 1.0 - torch.eye(n_agents).repeat_interleave(n_actions, 1)
        self.register_buffer("others", others, persistent=False)

    @staticmethod
    def input_dim(state_dim: int, obs_dim: int, n_agents: int, n_actions: int) -> int:
        return state_dim + obs_dim + n_agents * n_actions + n_agents

    def inputs(self, state: torch.Tensor, obs: torch.Tensor, actions: torch.Tensor,
               present: torch.Tensor) -> torch.Tensor:
        """``state [N, *state_shape]``, ``obs [N, A, *obs_shape]``, ``actions [N, A]`` (integers),
        ``present [N, A]`` -> per-agent critic inputs ``[N, A, D]``."""
        N, A = present.shape
        taken = torch.where(present, actions.long(), 0)
        one_hot = F.one_hot(taken, self.n_actions).float() * present.unsqueeze(-1)       # [N, A, n]
        others = one_hot.reshape(N, 1, A * self.n_actions) * self.others                  # [N, A, A*n]
        ids = torch.eye(A, device=state.device).expand(N, A, A)
        return torch.cat([state.reshape(N, 1, -1).float().expand(N, A, -1), obs.reshape(N, A, -1).float(),
                          others, ids], -1)

    def forward(self, state: torch.Tensor, obs: torch.Tensor, actions: torch.Tensor,
                present: torch.Tensor) -> torch.Tensor:
        """Inputs with any leading dims ``[...]`` (``state [..., *state_shape]``, ``obs [..., A,
        *obs_shape]``, ``actions``/``present [..., A]``) -> Q-values ``[..., A, n_actions]``."""
        lead = present.shape[:-1]
        A = self.n_agents
        x = self.inputs(state.reshape(-1, *state.shape[len(lead):]), obs.reshape(-1, *obs.shape[len(lead):]),
                        actions.reshape(-1, A), present.reshape(-1, A).bool())
        features, _ = self.encoder(x.reshape(1, -1, x.shape[-1]))
        return self.head(features).reshape(*lead, A, self.n_actions)

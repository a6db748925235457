"""An off-policy algorithm of your own in one file: VDN whose team Q weighs each agent's Q-value by
a learned, non-negative weight (so the team's greedy action stays every agent's greedy action, as in
VDN and QMIX), with a typed config of its own.

    python examples/custom_mixer.py --list
    python examples/custom_mixer.py --agent WVDN --env mpe_spread --set runner.total_steps=20000
    marlkit --import custom_mixer --agent WVDN --env lbf_8x8_2p_2f_coop   # with examples/ on PYTHONPATH

Running this file is the ``marlkit`` command with the new agent registered: every CLI flag works.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from marlkit.agents.value_decomposition import ValueDecompositionConfig
from marlkit.agents.vdn import VDN
from marlkit.registry import register_agent


class WeightedSumMixer(nn.Module):
    """Q_tot = sum over present agents of softplus(w_a) * Q_a: one weight per agent slot."""

    def __init__(self, n_agents: int, initial_weight: float):
        super().__init__()
        # softplus(w) = initial_weight at the start
        self.w = nn.Parameter(torch.full((n_agents,), float(torch.log(torch.expm1(torch.tensor(initial_weight))))))

    def forward(self, q: torch.Tensor, state: torch.Tensor | None, present: torch.Tensor) -> torch.Tensor:
        """``q``, ``present`` ``[L, B, A]`` -> ``[L, B]``; ``state`` is not read."""
        return (torch.where(present, q, 0.0) * nn.functional.softplus(self.w)).sum(-1)


@dataclass
class WeightedVDNConfig(ValueDecompositionConfig):
    # YAML: agents: {WVDN: {initial_weight: 0.5}}
    initial_weight: float = field(default=1.0, metadata={"min": 0.01})


@register_agent("WVDN")
class WeightedVDN(VDN):
    """VDN with a learned non-negative weight per agent in the team's sum (``examples/custom_mixer.py``)."""

    config_cls = WeightedVDNConfig

    def build_mixer(self) -> nn.Module:
        return WeightedSumMixer(self.mixed_agents, self.cfg.initial_weight)


if __name__ == "__main__":
    from marlkit.cli import main

    raise SystemExit(main())

"""QMIX: monotonic value function factorisation (Rashid et al., 2018)."""
from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from marlkit.agents.value_decomposition import ValueDecompositionAgent, ValueDecompositionConfig
from marlkit.networks.mixers import QMixer
from marlkit.networks.mlp import flat_size
from marlkit.registry import register_agent


@dataclass
class QMIXConfig(ValueDecompositionConfig):
    """The family's settings and the mixer's size (EPyMARL's defaults)."""

    mixing_embed_dim: int = field(default=32, metadata={"min": 1})
    hypernet_layers: int = field(default=2, metadata={"min": 1, "max": 2})
    hypernet_embed: int = field(default=64, metadata={"min": 1})
    # normalise the state the hypernetworks read (EPyMARL: no); on mpe_spread, whose positions are
    # unbounded, QMIX diverged without it (docs/algorithms.md)
    state_norm: bool = False


@register_agent("QMIX")
class QMIX(ValueDecompositionAgent):
    """Q-learning of the team's Q through a monotonic mixer, its weights made by hypernetworks of the global state."""

    config_cls = QMIXConfig

    @classmethod
    def mixes_on_state(cls, cfg) -> bool:
        return True

    def build_mixer(self) -> nn.Module:
        cfg = self.cfg
        return QMixer(flat_size(self.state_shape), self.mixed_agents, cfg.mixing_embed_dim, cfg.hypernet_layers,
                      cfg.hypernet_embed, cfg.state_norm)

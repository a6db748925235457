"""VDN: value decomposition networks (Sunehag et al., 2018)."""
from __future__ import annotations

from torch import nn

from marlkit.agents.value_decomposition import ValueDecompositionAgent
from marlkit.networks.mixers import VDNMixer
from marlkit.registry import register_agent


@register_agent("VDN")
class VDN(ValueDecompositionAgent):
    """Q-learning of the team's Q as the sum of the present agents' Q-values, on the team reward."""

    def build_mixer(self) -> nn.Module:
        return VDNMixer()

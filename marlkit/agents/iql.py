"""IQL: independent Q-learning, each agent on its own reward, weights shared across the group."""
from __future__ import annotations

from marlkit.agents.value_decomposition import ValueDecompositionAgent
from marlkit.registry import register_agent


@register_agent("IQL")
class IQL(ValueDecompositionAgent):
    """Independent Q-learning: one shared Q network, each agent's TD target from its own reward.

    The value-decomposition family without a mixer (``agents/value_decomposition.py``): the baseline
    that VDN and QMIX improve on by learning the team's Q."""

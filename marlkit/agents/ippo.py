"""IPPO: MAPPO's machinery with a decentralised critic that sees only the agent's own observation."""
from __future__ import annotations

from marlkit.agents.mappo import MAPPO
from marlkit.registry import register_agent


@register_agent("IPPO")
class IPPO(MAPPO):
    def critic_input_shape(self):
        return self.group.obs_shape

    def critic_input(self, obs, state):
        return obs

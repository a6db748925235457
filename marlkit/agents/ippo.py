"""IPPO: MAPPO's machinery with a decentralised critic that sees only the agent's own observation."""
from __future__ import annotations

from torch import nn

from marlkit.agents.mappo import MAPPO
from marlkit.config import OnPolicyConfig
from marlkit.networks.base import Encoder, init_linear
from marlkit.registry import register_agent


@register_agent("IPPO")
class IPPO(MAPPO):
    """The critic reads each agent's own observation (+ id), like the actor; the global state is
    never read, so it is not stored either."""

    config_cls = OnPolicyConfig

    @classmethod
    def stores_state(cls, cfg, state_from_obs: bool) -> bool:
        return False   # the global state is never read

    def critic_encoder(self) -> Encoder:
        return self._encoder("critic", self.group.obs_shape, per_agent=True)

    def critic_head(self, critic: Encoder) -> nn.Module:
        return init_linear(nn.Linear(critic.out_dim + self._id_width_after(self.group.obs_shape), 1), gain=1.0)

    def values(self, obs, state, hidden, episode_start, agent_mask=None):
        features, hidden = self.encode_agents(self.modules["critic"], obs, hidden, episode_start, present=agent_mask)
        return self.modules["critic_head"](features).squeeze(-1), hidden

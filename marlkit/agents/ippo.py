"""IPPO: PPO with a decentralised critic that sees only the agent's own observation."""
from __future__ import annotations

from torch import nn

from marlkit.agents.on_policy import OnPolicyAgent, OnPolicyConfig
from marlkit.agents.shared_actor import SharedActor
from marlkit.networks.base import init_linear
from marlkit.registry import register_agent


@register_agent("IPPO")
class IPPO(OnPolicyAgent):
    """PPO with a shared actor and a critic of each agent's own observation (and id), like the actor.

    The global state is never read, so it is not stored either; weights are shared across the group.
    """

    config_cls = OnPolicyConfig

    @classmethod
    def stores_state(cls, cfg, state_from_obs: bool) -> bool:
        return False   # the global state is never read

    def build(self) -> dict[str, nn.Module]:
        self.actor = SharedActor(self.registered_name, self.group, self.env, self.cfg)
        actor = self.actor.encoder()
        critic = self.actor.model("critic", self.group.obs_shape, per_agent=True)
        head = self.actor.head(actor)
        value = init_linear(nn.Linear(critic.out_dim + self.actor.id_width_after(self.group.obs_shape), 1), gain=1.0)
        return {"actor": actor, "actor_head": head, "critic": critic, "critic_head": value}

    def param_groups(self) -> list[dict]:
        return self.actor_critic_groups(["actor", "actor_head"], ["critic", "critic_head"])

    def policy(self, obs, state, hidden, episode_start, action_mask, agent_mask=None):
        return self.actor.policy(self.modules, obs, hidden, episode_start, action_mask, agent_mask)

    def values(self, obs, state, hidden, episode_start, agent_mask=None):
        features, hidden = self.actor.encode(self.modules["critic"], obs, hidden, episode_start, present=agent_mask)
        return self.modules["critic_head"](features).squeeze(-1), hidden

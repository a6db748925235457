"""MAPPO: PPO with parameters shared across a group and a centralised critic on the global state."""
from __future__ import annotations

import torch
from torch import nn

from marlkit.agents.base import OnPolicyAgent, masked_mean
from marlkit.agents.losses import ppo_policy_loss, value_loss
from marlkit.config import ConfigError
from marlkit.networks.base import init_linear
from marlkit.networks.distributions import ActionHead
from marlkit.registry import get_model, register_agent


@register_agent("MAPPO")
class MAPPO(OnPolicyAgent):
    """Actor on each agent's own observation, critic on ``state`` (+ agent id), shared weights."""

    def critic_input_shape(self) -> tuple[int, ...]:
        return (int(torch.tensor(self.state_shape).prod()),)

    def critic_input(self, obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """``obs [L, B, A, ...]``, ``state [L, B, *state_shape]`` -> ``[L, B, A, D]``."""
        flat = state.reshape(*state.shape[:2], 1, -1).float()
        return flat.expand(-1, -1, self.n_agents, -1)

    # ------------------------------------------------------------------ networks

    def _with_id(self, x: torch.Tensor) -> torch.Tensor:
        if not self.cfg.use_agent_id:
            return x
        ids = torch.eye(self.n_agents, dtype=torch.float32, device=x.device).expand(*x.shape[:2], -1, -1)
        return torch.cat([x.float(), ids], -1)

    def _input_shape(self, shape: tuple[int, ...], role: str) -> tuple[int, ...]:
        if not self.cfg.use_agent_id:
            return shape
        if len(shape) != 1:
            raise ConfigError(f"agents.{self.registered_name}.use_agent_id needs flat {role} inputs, got shape "
                              f"{shape}; set use_agent_id: false for image observations")
        return (shape[0] + self.n_agents,)

    def build(self) -> dict[str, nn.Module]:
        cfg = self.cfg
        actor = get_model(cfg.actor.name)(self._input_shape(self.group.obs_shape, "actor"), cfg.actor)
        critic = get_model(cfg.critic.name)(self._input_shape(self.critic_input_shape(), "critic"), cfg.critic)
        return {"actor": actor, "actor_head": ActionHead(self.group.action_space, actor.out_dim, cfg.log_std_init),
                "critic": critic, "critic_head": init_linear(nn.Linear(critic.out_dim, 1), gain=1.0)}

    def param_groups(self) -> list[dict]:
        m = self.modules
        actor = list(m["actor"].parameters()) + list(m["actor_head"].parameters())
        critic = list(m["critic"].parameters()) + list(m["critic_head"].parameters())
        return [{"params": actor, "lr": self.cfg.lr}, {"params": critic, "lr": self.cfg.critic_lr or self.cfg.lr}]

    def _run(self, encoder: nn.Module, x: torch.Tensor, hidden, episode_start):
        """Encode ``[L, B, A, D]`` with agents folded into the batch; hidden is ``[B, A, H]``."""
        L, B, A = x.shape[:3]
        h = hidden.reshape(B * A, -1) if hidden is not None and encoder.is_recurrent else None
        starts = episode_start.repeat_interleave(A, 1) if episode_start is not None else None
        features, h = encoder(x.reshape(L, B * A, *x.shape[3:]), h, starts)
        return features.reshape(L, B, A, -1), (h.reshape(B, A, -1) if h is not None else None)

    def policy(self, obs, state, hidden, episode_start, action_mask):
        features, hidden = self._run(self.modules["actor"], self._with_id(obs), hidden, episode_start)
        return self.modules["actor_head"](features, action_mask), hidden

    def values(self, obs, state, hidden, episode_start):
        x = self._with_id(self.critic_input(obs, state))
        features, hidden = self._run(self.modules["critic"], x, hidden, episode_start)
        return self.modules["critic_head"](features).squeeze(-1), hidden

    # ------------------------------------------------------------------ loss

    def loss(self, batch):
        cfg = self.cfg
        mask = batch["agent_mask"].float()
        h_actor, h_critic = self.split_hidden(batch["hidden"][0]) if "hidden" in batch else (None, None)
        action_mask = batch["action_mask"] if self.group.n_actions else None
        dist, _ = self.policy(batch["obs"], batch["state"], h_actor, batch["episode_start"], action_mask)
        log_prob = dist.log_prob(batch["actions"])
        policy_loss, info = ppo_policy_loss(log_prob, batch["log_prob"], batch["advantages"], cfg.clip, mask)
        entropy = masked_mean(dist.entropy(), mask)
        value, _ = self.values(batch["obs"], batch["state"], h_critic, batch["episode_start"])
        critic_loss = value_loss(value, batch["old_value"], self.normalized_returns(batch["returns"]), mask,
                                 cfg.value_clip, cfg.huber_delta)
        loss = policy_loss + cfg.value_coef * critic_loss - cfg.entropy_coef * entropy
        return loss, {"policy_loss": policy_loss.detach(), "value_loss": critic_loss.detach(),
                      "entropy": entropy.detach(), **info}

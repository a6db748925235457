"""MA-POCA: multi-agent posthumous credit assignment (Cohen et al., 2021), ML-Agents' cooperative
algorithm.

Decentralised actors (shared weights, as in MAPPO) learn with PPO from a counterfactual advantage::

    A^i_t = G_t - b^i(o^i_t, {(o^j_t, a^j_t)}_{j != i})

where ``G_t`` is the team's lambda-return, built on a value of the agents present, and ``b^i``
values everything but agent i's own action. Both come from one attention critic over a set of
agents (``marlkit/networks/poca_critic.py``), so the team may grow and shrink.

The return is the team's, not each agent's: an agent that leaves the episode (dies, is removed)
while its team plays on is still credited, at its last step, with what the team earns
afterwards. A team is the group, or each sub-team of it (``GroupSpec.subteams``: the fields of a
Unity scene); its reward at a step is the mean of its agents' (each already holds the group
reward, ``env.group_reward_weight``); its episode ends where every agent still in it has ended.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces

from marlkit.agents.losses import value_loss
from marlkit.agents.on_policy import OnPolicyAgent, OnPolicyConfig
from marlkit.agents.shared_actor import SharedActor
from marlkit.config import RunnerConfig
from marlkit.errors import ConfigError
from marlkit.networks.poca_critic import POCACritic
from marlkit.registry import register_agent
from marlkit.spec import hybrid_parts
from marlkit.storage.returns import compute_gae


@dataclass
class POCAConfig(OnPolicyConfig):
    """OnPolicyConfig with the attention critic's width and heads; the value and the baselines
    regress on one return, unclipped (``value_clip`` null)."""

    value_clip: Optional[float] = field(default=None, metadata={"min": 0.0})
    attention_width: int = field(default=64, metadata={"min": 1})
    attention_heads: int = field(default=4, metadata={"min": 1})


def action_features(space: spaces.Space, actions: torch.Tensor) -> torch.Tensor:
    """Actions ``[..., A, ...]`` as the critic reads them ``[..., A, action_width]``: one-hot per
    discrete branch, continuous values as they are (a hybrid action: its continuous values, then
    its branches one-hot)."""
    hybrid = hybrid_parts(space)
    if hybrid is not None:
        n, branches = hybrid
        choices = actions[..., n:].round().long()
        return torch.cat([actions[..., :n].float(),
                          *(F.one_hot(choices[..., k], b).float() for k, b in enumerate(branches))], -1)
    if isinstance(space, spaces.Discrete):
        return F.one_hot(actions.long(), int(space.n)).float()
    if isinstance(space, spaces.MultiDiscrete):
        return torch.cat([F.one_hot(actions[..., k].long(), int(n)).float() for k, n in enumerate(space.nvec)], -1)
    return actions.float().flatten(start_dim=actions.dim() - len(space.shape) if space.shape else actions.dim())


def action_width(space: spaces.Space) -> int:
    hybrid = hybrid_parts(space)
    if hybrid is not None:
        return hybrid[0] + sum(hybrid[1])
    if isinstance(space, spaces.Discrete):
        return int(space.n)
    if isinstance(space, spaces.MultiDiscrete):
        return int(np.sum(space.nvec))
    return int(np.prod(space.shape))


def team_columns(subteams, n_agents: int) -> np.ndarray:
    """Per agent slot, its team's column: sub-teams in order of their ids (sub-team 0, or no
    sub-teams, is the whole group, one column)."""
    ids = np.asarray(subteams if subteams is not None else [0] * n_agents)
    return np.unique(ids, return_inverse=True)[1].reshape(-1)


def per_team(x: np.ndarray, columns: np.ndarray, weight: np.ndarray, how: str = "mean") -> np.ndarray:
    """``x [..., A]`` -> ``[..., K]``: per team column, the ``weight``-ed mean (or sum) of its agents'."""
    K = int(columns.max()) + 1
    one_hot = np.eye(K, dtype=np.float32)[columns]                       # [A, K]
    total = (x * weight) @ one_hot
    if how == "sum":
        return total
    return total / np.maximum(weight.astype(np.float32) @ one_hot, 1.0)


def team_returns(reward: np.ndarray, value: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
                 episode_end: np.ndarray, agent_mask: np.ndarray, truncation_value: np.ndarray,
                 last_value: np.ndarray, bootstrap_mask: np.ndarray, columns: np.ndarray, gamma: float,
                 lam: float) -> np.ndarray:
    """Each present agent's lambda-return ``[T, E, A]``: its team's (``columns``: per agent slot,
    its team), over the team's reward (the mean of the rewards of its agents in the episode at that
    step: present, or ending there) and value (the mean of its present agents' values, one per team
    as the critic gives it). A team's episode ends where an agent ended and every agent still there
    ended with it, so an agent that left before has, at its last step, the return of what the team
    earned after it. 0 where the agent is absent."""
    ended = terminated | truncated
    in_episode = (agent_mask | ended).astype(np.float32)
    ones = np.ones_like(in_episode)
    count = lambda mask: per_team(mask.astype(np.float32), columns, ones, "sum")  # noqa: E731
    team_present = count(agent_mask) > 0                                       # [T, E, K]
    team_end = (count(ended) > 0) & (count(agent_mask & ~ended) == 0)
    team_truncated = team_end & (count(truncated) > 0)
    _, returns = compute_gae(per_team(reward, columns, in_episode), per_team(value, columns, agent_mask),
                             team_end & ~team_truncated, team_truncated, episode_end, team_present,
                             per_team(truncation_value, columns, truncated), per_team(last_value, columns, bootstrap_mask),
                             gamma, lam)
    return np.where(agent_mask, returns[..., columns], 0.0).astype(np.float32)


@register_agent("POCA")
class POCA(OnPolicyAgent):
    """MA-POCA: a shared actor, an attention critic over the agents present, and a counterfactual
    baseline per agent; agents that leave are still credited with what their team earns after.

    Feed-forward networks; any action space (the baseline reads discrete actions one-hot).
    """

    config_cls = POCAConfig

    @classmethod
    def stores_state(cls, cfg, state_from_obs: bool) -> bool:
        return False   # the critic reads the agents' observations, not the state

    @classmethod
    def check_config(cls, cfg: POCAConfig, rc: RunnerConfig, key: str) -> None:
        super().check_config(cfg, rc, key)
        cls.require_feed_forward(cfg, key, "its critic values sets of agents step by step")
        if cfg.attention_width % cfg.attention_heads:
            raise ConfigError(f"{key}.attention_width: {cfg.attention_width} is not a multiple of "
                              f"{key}.attention_heads: {cfg.attention_heads}")

    # ------------------------------------------------------------------ networks

    def build(self) -> dict:
        self.actor = SharedActor(self.registered_name, self.group, self.env, self.cfg)
        actor = self.actor.encoder()
        head = self.actor.head(actor)
        encoder = self.actor.model("critic", self.group.obs_shape, per_agent=True, ids=False)
        critic = POCACritic(encoder.out_dim, action_width(self.group.action_space), self.n_agents,
                            self.cfg.attention_width, self.cfg.attention_heads, self.cfg.critic.activation,
                            self.group.subteams)
        self.columns = team_columns(self.group.subteams, self.n_agents)
        return {"actor": actor, "actor_head": head, "critic": encoder, "critic_head": critic}

    def param_groups(self) -> list[dict]:
        return self.actor_critic_groups(["actor", "actor_head"], ["critic", "critic_head"])

    def policy(self, obs, state, hidden, episode_start, action_mask, agent_mask=None):
        return self.actor.policy(self.modules, obs, hidden, episode_start, action_mask, agent_mask)

    @property
    def critic_acts_online(self) -> bool:
        return False

    def _critic(self, obs, actions, agent_mask, value_only: bool):
        present = agent_mask if agent_mask is not None else torch.ones(obs.shape[:3], device=obs.device)
        features, _ = self.actor.encode(self.modules["critic"], obs, None, None, ids=False, present=present)
        acts = action_features(self.group.action_space, actions) if actions is not None else None
        return self.modules["critic_head"](features, acts, present, value_only)

    def values(self, obs, state, hidden, episode_start, agent_mask=None):
        """The team's value ``[L, B, A]`` (each agent holds its team's), normalised."""
        value, _ = self._critic(obs, None, agent_mask, value_only=True)
        return value, None

    @torch.no_grad()
    def baselines(self, obs: np.ndarray, actions: np.ndarray, agent_mask: np.ndarray) -> np.ndarray:
        """Real-scale baselines ``[N, A]`` of ``N`` steps, in chunks of about ``value_chunk_bytes``."""
        parts = []
        for part in self.chunks(len(obs), obs[:1].nbytes):
            _, b = self._critic(self.tensor(obs[part]).unsqueeze(0), self.tensor(actions[part]).unsqueeze(0),
                                self.tensor(agent_mask[part]).unsqueeze(0), value_only=False)
            parts.append(self._denormalize(b)[0].cpu().numpy())
        return np.concatenate(parts) if parts else np.zeros((0, self.n_agents), np.float32)

    # ------------------------------------------------------------------ targets

    @torch.no_grad()
    def targets(self, batch, last_value: np.ndarray, truncation_value: np.ndarray) -> dict:
        """The team's lambda-return per team column (each agent's is its team's), the advantage of
        each present agent over its baseline, and the normalised value and baseline the rollout
        had (``old_value``, ``old_baseline``)."""
        rollout, cfg = batch.rollout, self.cfg
        T, E = rollout.horizon, rollout.num_envs
        present = rollout.agent_mask
        returns = team_returns(rollout.reward, rollout.value, rollout.terminated, rollout.truncated,
                               rollout.episode_end, present, truncation_value, last_value,
                               batch.bootstrap.agent_mask, self.columns, cfg.gamma, cfg.gae_lambda)
        flat = lambda x: x.reshape(T * E, *x.shape[2:])  # noqa: E731
        baseline = self.baselines(flat(rollout.obs), flat(rollout.actions), flat(present)).reshape(T, E, -1)
        advantages = np.where(present, returns - baseline, 0.0).astype(np.float32)
        old_value, old_baseline = self.tensor(rollout.value), self.tensor(baseline)
        if self.value_norm is not None:
            old_value, old_baseline = self.value_norm.normalize(old_value), self.value_norm.normalize(old_baseline)
            self.value_norm.update(self.tensor(returns[present]))
        return {"advantages": advantages, "returns": returns, "old_value": old_value.cpu().numpy(),
                "old_baseline": old_baseline.cpu().numpy()}

    # ------------------------------------------------------------------ loss

    def loss(self, batch):
        present = batch["agent_mask"]
        dist, _ = self.policy(batch["obs"], None, None, None, batch["action_mask"] if self.group.n_actions else None,
                              present)
        value, baseline = self._critic(batch["obs"], batch["actions"], present, value_only=False)
        loss, metrics = self.ppo_loss(batch, dist.log_prob(batch["actions"]), dist.entropy, lambda: value)
        target = self.normalized_returns(batch["returns"])
        baseline_loss = value_loss(baseline, batch["old_baseline"], target, present.float(), self.cfg.value_clip,
                                   self.cfg.huber_delta)
        return loss + self.cfg.value_coef * baseline_loss, {**metrics, "baseline_loss": baseline_loss.detach()}

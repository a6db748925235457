"""COMA: counterfactual multi-agent policy gradients (Foerster et al., 2018).

Decentralised actors (shared weights, agent id, as in MAPPO) learn from a counterfactual
advantage given by a centralised Q critic::

    A^a = Q(s, u) - sum_u' pi^a(u' | o^a) Q(s, (u^-a, u'))

The baseline marginalises only agent a's own action, with the others' kept, so it tells how much
a's choice helped the group. The critic (``marlkit/networks/coma_critic.py``) gives all of a's
Q-values in one pass. It regresses on TD(lambda) targets built from a target critic that is synced
every ``target_update_interval`` updates.

Inherently quadratic in agents: each agent's critic input holds the others' one-hot actions
(A x n_actions values), so a step of A agents costs about A^2 n_actions in the critic's first
layer (measured against MAPPO in docs/benchmarks.md, "MAT and COMA: speed").
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch
from torch import nn

from marlkit.agents.base import require_discrete
from marlkit.agents.on_policy import OnPolicyAgent, OnPolicyConfig
from marlkit.agents.shared_actor import SharedActor
from marlkit.config import RunnerConfig
from marlkit.errors import ConfigError
from marlkit.networks.coma_critic import COMACritic
from marlkit.networks.mlp import flat_size
from marlkit.registry import get_model, register_agent
from marlkit.storage.returns import compute_gae, last_present_value


@dataclass
class COMAConfig(OnPolicyConfig):
    """OnPolicyConfig with COMA's defaults and its target critic. ``gae_lambda`` is the lambda of
    the critic's TD(lambda) targets (the same lambda-return GAE is built on)."""

    # the actor follows the critic's Q: a low-variance but biased signal that PPO's epochs would
    # lock onto early (policy entropy 0.6 of 1.6 after 20k steps of mpe_spread at lr 7e-4, 1.3 at
    # 1.5e-4), so the actor learns slower than the critic
    lr: float = field(default=1.5e-4, metadata={"min": 0.0})
    critic_lr: Optional[float] = field(default=7e-4, metadata={"min": 0.0})
    gae_lambda: float = field(default=0.8, metadata={"min": 0.0, "max": 1.0})
    value_clip: Optional[float] = field(default=None, metadata={"min": 0.0})
    # updates between copies of the critic into the target critic that builds the TD(lambda) targets
    target_update_interval: int = field(default=2, metadata={"min": 1})


def taken(q: torch.Tensor, actions: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """Q ``[..., A, n]`` of the actions ``[..., A]`` (0 for absent slots, whatever their action holds)."""
    index = torch.where(present.bool(), actions.long(), 0)
    return torch.where(present.bool(), q.gather(-1, index.unsqueeze(-1)).squeeze(-1), 0.0)


def counterfactual_advantage(q: torch.Tensor, probs: torch.Tensor, actions: torch.Tensor,
                             action_mask: torch.Tensor, present: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (advantage ``[..., A]``, baseline ``[..., A]``) from Q ``[..., A, n]``, the policy's
    probabilities ``[..., A, n]`` and the legal actions ``action_mask [..., A, n]``: the baseline is
    the policy-weighted mean of Q over legal actions (the policy renormalised on them)."""
    legal = probs * action_mask
    legal = legal / legal.sum(-1, keepdim=True).clamp(min=1e-12)
    baseline = torch.where(action_mask.bool(), legal * q, 0.0).sum(-1)
    advantage = torch.where(present.bool(), taken(q, actions, present) - baseline, 0.0)
    return advantage, torch.where(present.bool(), baseline, 0.0)


@register_agent("COMA")
class COMA(OnPolicyAgent):
    """COMA: decentralised actors with a counterfactual baseline from a centralised Q critic.

    Discrete actions only; actor and critic are feed-forward registered models. The actor step is
    PPO's clipped surrogate on the counterfactual advantage: with ``epochs: 1, minibatches: 1`` the
    ratio is 1 and it is the paper's policy gradient; more epochs reuse each rollout.
    """

    config_cls = COMAConfig

    @classmethod
    def stores_state(cls, cfg, state_from_obs: bool) -> bool:
        return True   # the Q critic reads the state
    checks_groups = True

    def __init__(self, group, env, cfg: COMAConfig, seed=0, device="cpu"):
        self.check_group(group)
        super().__init__(group, env, cfg, seed, device)
        if self.value_norm is not None:
            # the target critic's outputs are on the scale of the statistics it was trained under;
            # the live normaliser moves on with every update
            self.modules["target_value_norm"] = copy.deepcopy(self.value_norm)
        self.updates = 0

    @classmethod
    def check_group(cls, group) -> None:
        require_discrete(cls.registered_name, group)

    @classmethod
    def check_config(cls, cfg: COMAConfig, rc: RunnerConfig, key: str) -> None:
        super().check_config(cfg, rc, key)
        cls.require_feed_forward(cfg, key, "the rollout is valued and the baseline computed step by step")

    # ------------------------------------------------------------------ networks

    def build(self) -> dict[str, nn.Module]:
        obs_shape, n_actions = self.group.obs_shape, self.group.n_actions
        self.actor = SharedActor(self.registered_name, self.group, self.env, self.cfg)
        actor = self.actor.encoder()
        head = self.actor.head(actor)
        in_dim = COMACritic.input_dim(flat_size(self.state_shape), flat_size(obs_shape), self.n_agents, n_actions)
        try:
            encoder = get_model(self.cfg.critic.name)((in_dim,), self.cfg.critic)
        except ConfigError as exc:
            raise ConfigError(f"agents.{self.registered_name}.critic: {exc}") from None
        critic = COMACritic(encoder, self.n_agents, n_actions)
        target = copy.deepcopy(critic).requires_grad_(False)
        return {"actor": actor, "actor_head": head, "critic": critic, "target_critic": target}

    def param_groups(self) -> list[dict]:
        return self.actor_critic_groups(["actor", "actor_head"], ["critic"])

    def policy(self, obs, state, hidden, episode_start, action_mask, agent_mask=None):
        return self.actor.policy(self.modules, obs, hidden, episode_start, action_mask, agent_mask)

    @property
    def critic_acts_online(self) -> bool:
        return False

    # ------------------------------------------------------------------ targets

    @torch.no_grad()
    def q_values(self, critic: str, state: np.ndarray, obs: np.ndarray, actions: np.ndarray,
                 present: np.ndarray) -> torch.Tensor:
        """Normalised Q ``[N, A, n]`` of ``N`` steps from ``critic`` (``"critic"`` or
        ``"target_critic"``), in chunks of about ``value_chunk_bytes`` of input."""
        parts = [self.modules[critic](self.tensor(state[part]), self.tensor(obs[part]), self.tensor(actions[part]),
                                      self.tensor(present[part]))
                 for part in self.chunks(len(obs), obs[:1].nbytes + state[:1].nbytes)]
        return torch.cat(parts) if parts else torch.zeros(0, self.n_agents, self.group.n_actions)

    def _target_q_taken(self, state, obs, actions, present) -> np.ndarray:
        """Real-scale target-critic Q ``[N, A]`` of the joint actions ``actions [N, A]``."""
        q = taken(self.q_values("target_critic", state, obs, actions, present), self.tensor(actions),
                  self.tensor(present))
        return (self.modules["target_value_norm"].denormalize(q) if self.value_norm is not None else q).cpu().numpy()

    def estimate_values(self, batch):
        """``rollout.value`` := target Q(s_t, u_t) of the stored joint actions; the bootstrap and the
        truncation finals are valued at a joint action the current policy picks there."""
        rollout, bootstrap = batch.rollout, batch.bootstrap
        T, E = rollout.horizon, rollout.num_envs
        flat = lambda x: x.reshape(T * E, *x.shape[2:])  # noqa: E731
        rollout.value[:] = self._target_q_taken(flat(rollout.state), flat(rollout.obs), flat(rollout.actions),
                                                flat(rollout.agent_mask)).reshape(T, E, -1)
        joint = self.joint_actions(bootstrap.obs, bootstrap.state, bootstrap.agent_mask, bootstrap.action_mask,
                                   bootstrap.hidden)
        last_value = np.where(bootstrap.agent_mask,
                              self._target_q_taken(bootstrap.state, bootstrap.obs, joint, bootstrap.agent_mask),
                              last_present_value(rollout.value, rollout.agent_mask))
        truncation_value = np.zeros_like(rollout.value)
        finals = self.finals(rollout)
        if finals is not None:
            joint = self.joint_actions(finals["obs"], finals["state"], finals["agent_mask"], finals["action_mask"],
                                       finals["hidden"])
            truncation_value[finals["t"], finals["e"]] = self._target_q_taken(finals["state"], finals["obs"], joint,
                                                                              finals["agent_mask"])
        return last_value, truncation_value

    @torch.no_grad()
    def targets(self, batch, last_value, truncation_value) -> dict:
        """TD(lambda) ``returns`` (real scale) for the critic, the counterfactual ``advantages`` from
        the critic and the policy that collected the rollout, ``old_value`` (normalised Q of the
        taken actions, for ``value_clip``); updates the value normaliser with the returns."""
        rollout, cfg = batch.rollout, self.cfg
        T, E = rollout.horizon, rollout.num_envs
        # GAE's returns over the Q-values of the actions taken are their TD(lambda) targets
        # (A_t + Q_t = G_t), masks and cuts handled as for any on-policy agent
        _, returns = compute_gae(rollout.reward, rollout.value, rollout.terminated, rollout.truncated,
                                 rollout.episode_end, rollout.agent_mask, truncation_value, last_value, cfg.gamma,
                                 cfg.gae_lambda)
        flat = lambda x: x.reshape(T * E, *x.shape[2:])  # noqa: E731
        q = self.q_values("critic", flat(rollout.state), flat(rollout.obs), flat(rollout.actions),
                          flat(rollout.agent_mask))
        action_mask, present, actions = (self.tensor(flat(x)) for x in (rollout.action_mask, rollout.agent_mask,
                                                                         rollout.actions))
        dist, _ = self.policy(self.tensor(flat(rollout.obs)).unsqueeze(0), None, None, None, action_mask.unsqueeze(0))
        advantages, _ = counterfactual_advantage(self._denormalize(q), dist.log_probs[0].exp(), actions,
                                                 action_mask, present)
        old_value = taken(q, actions, present)
        if self.value_norm is not None:
            self.value_norm.update(self.tensor(returns[rollout.agent_mask]))
        return {"advantages": advantages.reshape(T, E, -1).cpu().numpy(), "returns": returns,
                "old_value": old_value.reshape(T, E, -1).cpu().numpy()}

    # ------------------------------------------------------------------ loss

    def loss(self, batch):
        present = batch["agent_mask"]
        dist, _ = self.policy(batch["obs"], batch["state"], None, None, batch["action_mask"], present)

        def q_taken():
            return taken(self.modules["critic"](batch["state"], batch["obs"], batch["actions"], present),
                         batch["actions"], present)

        return self.ppo_loss(batch, dist.log_prob(batch["actions"]), dist.entropy, q_taken)

    def after_update(self, progress) -> None:
        self.updates += 1
        if self.updates % self.cfg.target_update_interval == 0:
            self.modules["target_critic"].load_state_dict(self.modules["critic"].state_dict())
            if self.value_norm is not None:
                self.modules["target_value_norm"].load_state_dict(self.value_norm.state_dict())

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict:
        return {**super().state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict, weights_only: bool = False) -> None:
        modules = state["modules"]
        if self.value_norm is not None and "target_value_norm.mean" not in modules:
            # checkpoints from before the target critic kept its own statistics
            state = {**state, "modules": {**modules, **{f"target_{k}": v for k, v in modules.items()
                                                        if k.startswith("value_norm.")}}}
        super().load_state_dict(state, weights_only)
        if not weights_only:
            self.updates = state["updates"]

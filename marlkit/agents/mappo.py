"""MAPPO: PPO with parameters shared across a group and a centralised critic, on the global state
or on the group's observations pooled."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

import torch
from torch import nn

from marlkit.agents.on_policy import OnPolicyAgent, OnPolicyConfig
from marlkit.agents.shared_actor import SharedActor
from marlkit.config import RunnerConfig
from marlkit.errors import ConfigError
from marlkit.networks.base import Encoder
from marlkit.networks.heads import SharedValueHead
from marlkit.networks.mlp import flat_size
from marlkit.networks.pooled import PooledValueHead
from marlkit.registry import get_model, register_agent


@dataclass
class MAPPOConfig(OnPolicyConfig):
    """OnPolicyConfig and what the centralised critic reads (``critic_input``): ``state``, the
    global state (the env's ``state()``, or every agent's observation concatenated where it has
    none), encoded once per env step; ``pooled``, each agent's observation through the ``critic``
    model, pooled over the group (``pool``: mean, max or attention; ``marlkit/networks/pooled.py``),
    whose cost per agent does not grow with the number of agents; ``auto``: ``pooled`` where the
    env's state was built from the observations and the group plays in a team of its own
    (``EnvSpec.state_in_obs_of``), else ``state``: a team of several groups is read whole.

    ``critic_encoder`` is what encodes the observations for a pooled critic: ``own``, the
    ``critic`` model; ``actor``, the actor's encoder, one pass serving both, so the critic costs a
    pool and a small head per agent (a recurrent actor shares its feed-forward trunk, the CNN of a
    ``gru`` over a ``cnn``: the critic reads the trunk's features, the actor goes on through its
    memory); ``auto``: ``actor`` where the actor is feed-forward, else ``own``. ``critic_encoder_grad`` scales the value loss's gradient into that shared encoder: 1
    trains it with both losses (PPO with a shared trunk), 0 leaves it to the policy loss (the
    critic reads the actor's features as they are), values between weigh the two; null (default):
    ``SHARED_ENCODER_GRAD``.
    """

    critic_input: Literal["auto", "state", "pooled"] = "auto"
    pool: Literal["mean", "max", "attention"] = "mean"
    critic_encoder: Literal["auto", "own", "actor"] = "auto"
    critic_encoder_grad: Optional[float] = field(default=None, metadata={"min": 0.0, "max": 1.0})


# A tenth of the value gradient into the shared encoder: with all of it the policy stalled on
# pursuit, with none it learned pursuit well behind a critic encoder of its own; at a tenth it
# learned pursuit, mpe_tag and mpe_spread as well as that encoder or better (docs/benchmarks.md),
# at 0.6 of its arithmetic.
SHARED_ENCODER_GRAD = 0.1


@register_agent("MAPPO")
class MAPPO(OnPolicyAgent):
    """PPO with a shared actor and a centralised critic on the global state or the pooled observations.

    The actor (``SharedActor``) reads each agent's own observation; the centralised critic
    (``critic_input``) reads ``state``, encoded once per env step by any registered model (an image
    state by a ``cnn``) and read out per agent by a head that sees the agent id, or the group's
    observations pooled. Weights are shared across the group.
    """

    config_cls = MAPPOConfig

    @staticmethod
    def pools(cfg, state_from_obs: bool) -> bool:
        """Whether the critic pools the observations (``critic_input``, ``auto`` resolved)."""
        choice = getattr(cfg, "critic_input", "state")   # a subclass on OnPolicyConfig lacks it: the state
        return choice == "pooled" or (choice == "auto" and state_from_obs)

    @staticmethod
    def encoder_choice(cfg) -> str:
        """``critic_encoder`` with ``auto`` resolved: ``actor`` or ``own``."""
        choice = getattr(cfg, "critic_encoder", "own")   # a subclass on OnPolicyConfig lacks it: its own
        if choice == "auto":
            return "own" if get_model(cfg.actor.name).is_recurrent else "actor"
        return choice

    @classmethod
    def check_config(cls, cfg, rc: RunnerConfig, key: str) -> None:
        super().check_config(cfg, rc, key)
        unshared = getattr(cfg, "critic_encoder_grad", None) is not None and cls._no_shared_encoder(cfg, key)
        if unshared:
            why, fix = unshared
            raise ConfigError(f"{key}.critic_encoder_grad={cfg.critic_encoder_grad} scales the value gradient "
                              f"into the actor's encoder that a pooled critic shares, but {why}; {fix}, or "
                              f"leave {key}.critic_encoder_grad unset")
        if getattr(cfg, "critic_encoder", "own") == "actor":
            if cfg.critic_input == "state":
                raise ConfigError(f"{key}.critic_encoder=actor shares the actor's encoder with a pooled critic, but "
                                  f"{key}.critic_input=state; set {key}.critic_input to pooled (or auto), or "
                                  f"{key}.critic_encoder to own")
            actor = get_model(cfg.actor.name)
            if actor.is_recurrent and not hasattr(actor, "trunk"):
                raise ConfigError(f"{key}.critic_encoder=actor shares the feed-forward trunk of a recurrent actor, and "
                                  f"{key}.actor.name={cfg.actor.name} has none (a trunk() method, as gru's); set "
                                  f"{key}.critic_encoder to own")

    @classmethod
    def _no_shared_encoder(cls, cfg, key: str) -> tuple[str, str] | None:
        """Why the critic of ``cfg`` shares no encoder with the actor, and the fix; None where it may."""
        if cfg.critic_input == "state":
            return f"{key}.critic_input=state", f"set {key}.critic_input to pooled (or auto)"
        if cls.encoder_choice(cfg) == "own":
            why = (f"{key}.critic_encoder=own" if cfg.critic_encoder == "own" else
                   f"{key}.critic_encoder=auto gives a recurrent actor ({key}.actor.name={cfg.actor.name}) "
                   "a critic encoder of its own")
            return why, f"set {key}.critic_encoder to actor (or auto, with a feed-forward actor)"
        return None

    @classmethod
    def stores_state(cls, cfg, state_from_obs: bool) -> bool:
        """A pooled critic reads the observations alone, so the state is not stored."""
        return not cls.pools(cfg, state_from_obs)

    # ------------------------------------------------------------------ networks

    def build(self) -> dict[str, nn.Module]:
        self.actor = SharedActor(self.registered_name, self.group, self.env, self.cfg)
        actor = self.actor.encoder()
        critic = None if self.shares_encoder else self.critic_encoder()   # drawn before the head, as always
        head = self.actor.head(actor)
        if critic is None:
            return {"actor": actor, "actor_head": head, "critic_head": self.pooled_head(actor.trunk_dim)}
        return {"actor": actor, "actor_head": head, "critic": critic, "critic_head": self.critic_head(critic)}

    @property
    def pooled_critic(self) -> bool:
        return self.pools(self.cfg, self.env.state_in_obs_of(self.group.name))

    @property
    def shares_encoder(self) -> bool:
        """The pooled critic reads the actor's encodings (``critic_encoder``: ``actor``, or ``auto``
        with a feed-forward actor)."""
        return self.pooled_critic and self.encoder_choice(self.cfg) == "actor"

    def _critic_takes_ids(self) -> bool:
        return self.cfg.use_agent_id and get_model(self.cfg.critic.name).takes_ids

    def critic_encoder(self) -> Encoder:
        if self.pooled_critic:   # the id joins the value head, where it costs the same at any A
            return self.actor.model("critic", self.group.obs_shape, per_agent=True, ids=False)
        if self._critic_takes_ids():   # built for [state, one-hot id]; valued for all ids at once
            return self.actor.model("critic", (flat_size(self.state_shape) + self.n_agents,), per_agent=False)
        return self.actor.model("critic", self.state_shape, per_agent=False)

    def pooled_head(self, features: int) -> PooledValueHead:
        """The pool reads each agent's sub-team alone where the group has sub-teams (the fields of a
        Unity scene): one centralised critic per field, the weights shared as the actor's are."""
        return PooledValueHead(features, self.n_agents if self.cfg.use_agent_id else 0, self.cfg.pool,
                               self.cfg.critic.activation, subteams=self.group.subteams)

    def critic_head(self, critic: Encoder) -> nn.Module:
        if self.pooled_critic:
            return self.pooled_head(critic.out_dim)
        return SharedValueHead(critic.out_dim, self.n_agents, self.cfg.use_agent_id, self.cfg.critic.activation,
                               ids_in_encoder=critic.takes_ids and self._critic_takes_ids())

    def param_groups(self) -> list[dict]:
        return self.actor_critic_groups(["actor", "actor_head"], ["critic", "critic_head"])

    def actor_encodings(self, obs: torch.Tensor, agent_mask: torch.Tensor | None) -> torch.Tensor:
        """The encodings ``[L, B, A, trunk_dim]`` of the actor's trunk that a pooled critic on the
        actor's encoder reads (a recurrent actor's memory is not run): its value head adds the id
        itself, so it is not joined after them."""
        actor = self.modules["actor"]
        if actor.is_recurrent:
            return self.actor.trunk(actor, obs)
        features, _ = self.actor.encode(actor, obs, None, None, present=agent_mask, join_ids=False)
        return features

    def _value_grad_scaled(self, features: torch.Tensor) -> torch.Tensor:
        """``features`` as they are, with the value loss's gradient into them scaled by
        ``critic_encoder_grad`` (``s * x + (1 - s) * x.detach()``, detached outright at 0)."""
        scale = self.cfg.critic_encoder_grad
        if scale is None:
            scale = SHARED_ENCODER_GRAD
        if scale == 1.0:
            return features
        if scale == 0.0:
            return features.detach()
        return scale * features + (1.0 - scale) * features.detach()

    def policy(self, obs, state, hidden, episode_start, action_mask, agent_mask=None):
        return self.actor.policy(self.modules, obs, hidden, episode_start, action_mask, agent_mask)

    def sample(self, obs, state, agent_mask, action_mask, hidden, explore: bool, noise):
        """A recurrent actor whose trunk the critic shares values while it acts, from the same pass
        of the trunk (its memory steps online, so values are taken there, not in a second pass)."""
        if not (self.shares_encoder and self.recurrent):
            return super().sample(obs, state, agent_mask, action_mask, hidden, explore, noise)
        features, trunk, hidden = self.actor.encode_trunk(self.modules["actor"], obs, hidden, None, agent_mask)
        dist = self.modules["actor_head"](features, action_mask)
        action = dist.sample(noise) if explore else dist.mode()
        return action, dist.log_prob(action), hidden, self.modules["critic_head"](trunk, agent_mask)

    def values(self, obs, state, hidden, episode_start, agent_mask=None):
        """The state ``[L, B, *state_shape]`` is encoded once per env step (an ``mlp`` critic on
        ``[state, one-hot id]`` computes its first layer once for all ids). A recurrent critic keeps
        one memory per agent, ``hidden [B, A, H]``, all reading the same state: an agent's value is
        of its own episode, so its memory resets where that episode starts (``episode_start``
        ``[L, B, A]``), as the actor's does, also when the other agents' episodes go on. A pooled
        critic encodes ``obs [L, B, A, ...]`` per agent (with ``critic_encoder: actor``, through the
        actor's encoder) and pools over ``agent_mask``."""
        head = self.modules["critic_head"]
        if self.shares_encoder:
            return head(self.actor_encodings(obs, agent_mask), agent_mask), None
        encoder = self.modules["critic"]
        if self.pooled_critic:
            features, hidden = self.actor.encode(encoder, obs, hidden, episode_start, ids=False, present=agent_mask)
            return head(features, agent_mask), hidden
        if encoder.is_recurrent:
            L, B, A = state.shape[0], state.shape[1], self.n_agents
            h = hidden.reshape(B * A, -1) if hidden is not None else None
            starts = episode_start.reshape(L, B * A) if episode_start is not None else None
            features, h = encoder(state, h, starts, copies=A)     # [L, B, A, F]
            return head(features), h.reshape(B, A, -1)
        ids = {"n_ids": self.n_agents} if head.ids_in_encoder else {}
        features, _ = encoder(state, None, episode_start, **ids)
        return head(features), None

    # ------------------------------------------------------------------ loss

    def loss(self, batch):
        if not self.shares_encoder:
            return super().loss(batch)
        # one pass of the encoder (a recurrent actor's trunk) serves both losses
        action_mask = batch["action_mask"] if self.group.n_actions else None
        h_actor = self.split_hidden(batch["hidden"][0])[0] if "hidden" in batch else None
        features, trunk, _ = self.actor.encode_trunk(self.modules["actor"], batch["obs"], h_actor,
                                                     batch["episode_start"], batch["agent_mask"])
        dist = self.modules["actor_head"](features, action_mask)
        value = self.modules["critic_head"](self._value_grad_scaled(trunk), batch["agent_mask"])
        return self.ppo_loss(batch, dist.log_prob(batch["actions"]), dist.entropy, lambda: value)

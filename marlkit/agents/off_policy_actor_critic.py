"""The off-policy actor-critics of continuous actions: a policy per agent (weights shared across the
group, the agent id telling agents apart) and critics learned from a replay of transitions
(``storage/transitions.py``), on the off-policy family's owed gradient steps and target networks.

What the algorithms differ in:

- **the critic's scope** (``critic_scope``): ``agent``, each agent's Q of its own observation and
  action (IDDPG, ISAC); ``joint``, a centralised critic of the global state and every agent's
  action, with one Q per agent (MADDPG, MATD3, MASAC);
- **the policy**: deterministic with Gaussian exploration noise (``agents/ddpg.py``: DDPG's and
  TD3's) or a squashed Gaussian with a learned temperature (``agents/sac.py``);
- ``n_critics`` (TD3's and SAC's twin critics, the smaller of the two valued) and
  ``policy_delay`` (TD3's: the actor and the target networks move every that many critic steps).

Actions are learned in ``[-1, 1]`` per dimension and sent to the env mapped onto the Box's bounds.
Each agent learns on its own reward (``[B, A]``); the joint critic's actor step ascends the mean of
the agents' Q-values with every agent's action from the current policy (BenchMARL's MADDPG).

Agent masks: an agent absent at a step adds nothing to the critic's or the actor's loss, and its
action slot in the joint critic's input is zero; an agent whose value after the step does not
count (``bootstrap``: it terminated, or is absent at the next step) has a target of its reward
alone, and its next action slot is zero.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Literal, Optional

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from marlkit.agents.base import ActOut, Progress
from marlkit.agents.off_policy import OffPolicyAgent, OffPolicyConfig
from marlkit.agents.on_policy import known_model
from marlkit.agents.shared_actor import SharedActor
from marlkit.config import ModelConfig, RunnerConfig, value_range
from marlkit.errors import ConfigError
from marlkit.memory import MemoryEstimate
from marlkit.networks.base import as_float, init_linear
from marlkit.networks.mlp import flat_size
from marlkit.optim import Adam, gradient_step
from marlkit.random_streams import GeneratorNoise, StreamNoise
from marlkit.registry import get_model
from marlkit.storage import ReplayBatch, StorageLayout, TransitionReplay


def _small() -> ModelConfig:
    return ModelConfig(hidden_sizes=[64, 64], layer_norm=False)


@dataclass
class ActorCriticConfig(OffPolicyConfig):
    """The off-policy family's settings and those its actor-critics share. ``batch_size`` and
    ``buffer_size`` count transitions (one env step of the whole group)."""

    lr: float = field(default=1e-3, metadata=value_range(0.0))              # the critics'
    actor_lr: Optional[float] = field(default=None, metadata=value_range(0.0))   # null: lr
    batch_size: int = field(default=256, metadata=value_range(1))
    buffer_size: int = field(default=1_000_000, metadata=value_range(1))
    gradient_steps_per_env_step: float = field(default=0.25, metadata=value_range(0.0))
    # env steps before the first update; until then the agents act uniformly at random
    learning_starts: int = field(default=2_000, metadata=value_range(0))
    target_update_tau: Optional[float] = field(default=0.005, metadata=value_range(0.0, 1.0))
    critic_scope: Literal["agent", "joint"] = "joint"
    n_critics: int = field(default=1, metadata=value_range(1, 2))
    policy_delay: int = field(default=1, metadata=value_range(1))            # critic steps per actor step
    use_agent_id: bool = True
    actor: ModelConfig = field(default_factory=_small)
    critic: ModelConfig = field(default_factory=_small)


class OffPolicyActorCritic(OffPolicyAgent):
    """A shared policy and critics (``critic_scope``) on a replay of transitions; a subclass writes
    the policy: ``policy_outputs``, ``policy_actions`` and the actor's loss terms."""

    config_cls = ActorCriticConfig
    checks_groups = True
    replay_unit = "transitions"
    learner_only = (*OffPolicyAgent.learner_only, "actor_optimizer")

    def __init__(self, group, env, cfg: ActorCriticConfig, seed=0, device="cpu"):
        self.check_group(group)
        super().__init__(group, env, cfg, seed, device)
        self.generator = torch.Generator(device=self.device).manual_seed(self.seed)   # the learner's draws
        torch.manual_seed(self.seed)  # weight initialisation draws from the global generator
        space = group.action_space
        self.action_size = flat_size(space.shape)
        low, high = (torch.as_tensor(np.asarray(b, np.float32).reshape(-1), device=self.device)
                     for b in (space.low, space.high))
        self.action_mid, self.action_half = (high + low) / 2, (high - low) / 2
        self.shared = SharedActor(self.registered_name, group, env, cfg)
        actor = self.shared.model("actor", group.obs_shape, per_agent=True)
        width = actor.out_dim + self.shared.id_width_after(group.obs_shape)
        online = {"actor": actor, "actor_head": init_linear(nn.Linear(width, self.policy_outputs()), gain=0.01)}
        for i in range(cfg.n_critics):
            online[f"critic_{i}"], online[f"critic_{i}_head"] = self.build_critic()
        targets = {f"target_{k}": copy.deepcopy(m).requires_grad_(False) for k, m in online.items()
                   if k.startswith("critic") or self.has_target_actor}
        self.modules = nn.ModuleDict({**online, **targets, **self.extra_modules()}).to(self.device)
        self.set_optimizer()
        self._actor_params = [p for k in ("actor", "actor_head") for p in self.modules[k].parameters()]
        self.actor_optimizer = Adam([{"params": self._actor_params, "lr": cfg.actor_lr or cfg.lr}])

    # ------------------------------------------------------------------ before anything starts

    @classmethod
    def check_group(cls, group) -> None:
        space = group.action_space
        if not isinstance(space, spaces.Box):
            raise ConfigError(
                f"agents.{cls.registered_name}: {cls.registered_name} needs Box (continuous) actions, but group "
                f"{group.name!r} has {space}; run it with MAPPO, IPPO or QMIX (groups: {{{group.name}: "
                "{agent: MAPPO}}), or set the env's continuous actions (mpe: env.kwargs.continuous_actions: true)")
        if not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
            raise ConfigError(f"agents.{cls.registered_name}: group {group.name!r} has actions {space} without finite "
                              "bounds; the policy acts within them (wrap the env to bound its actions)")

    @classmethod
    def check_config(cls, cfg: ActorCriticConfig, rc: RunnerConfig, key: str) -> None:
        for role in ("actor", "critic"):
            model = getattr(cfg, role)
            known_model(model.name, f"{key}.{role}.name")
            if get_model(model.name).is_recurrent:
                raise ConfigError(f"{key}.{role}.name={model.name!r} is recurrent, but {cls.registered_name} learns "
                                  "from single transitions, which carry no memory; use 'mlp' (or 'cnn' for an actor "
                                  "of images)")
        if cfg.critic.name != "mlp":
            raise ConfigError(f"{key}.critic.name={cfg.critic.name!r}: the critic reads a flat vector of observations "
                              "(or the state) and actions; use 'mlp'")

    @classmethod
    def stores_state(cls, cfg) -> bool:
        return cfg.critic_scope == "joint"

    @classmethod
    def memory_estimate(cls, layout: StorageLayout, cfg: ActorCriticConfig, key: str = "") -> MemoryEstimate:
        """The replay's transitions and the rollouts it is filled from; an update holds a batch as
        float32, with about three times as much again for activations and gradients."""
        per = TransitionReplay.bytes_per_transition(layout, cls.stores_state(cfg))
        rollouts = (2 if layout.double else 1) * layout.horizon * layout.num_envs * per
        return MemoryEstimate(cfg.buffer_size * per + rollouts, cfg.batch_size * per * 4 * 4,
                              (f"{key}.buffer_size", f"{key}.batch_size"))

    # ------------------------------------------------------------------ for the algorithms

    has_target_actor = True   # DDPG's family values the next step with a target policy; SAC with its own
    stochastic = False        # whether the actor's step samples its actions (SAC) or takes them as they are

    def policy_outputs(self) -> int:
        """Width of the actor head's output for ``action_size`` action dimensions."""
        raise NotImplementedError

    def policy_actions(self, out: torch.Tensor, explore: bool, noise) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Actions in ``[-1, 1]`` ``[..., action_size]`` from the actor head's ``out`` ``[..., policy_outputs]``
        and, for a stochastic policy, their log-probability ``[...]`` (else None); ``explore``:
        with the policy's noise drawn from ``noise`` (``uniform``/``normal``)."""
        raise NotImplementedError

    def target_actions(self, out: torch.Tensor, noise) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The next step's actions for the critic's target, from the target (or own) policy's ``out``:
        sampled from a stochastic policy, a deterministic one's as they are."""
        return self.policy_actions(out, self.stochastic, noise)

    def actor_loss_terms(self, q: torch.Tensor, log_prob: torch.Tensor | None) -> torch.Tensor:
        """Per agent ``[B, A]``, what the actor's step descends, from the critic's ``q`` of the
        policy's actions."""
        return -q

    def entropy_bonus(self, log_prob: torch.Tensor | None) -> torch.Tensor | float:
        """What the next step's value gains from the policy's entropy (SAC's ``-alpha log pi``)."""
        return 0.0

    def extra_modules(self) -> dict[str, nn.Module]:
        return {}

    def after_actor_step(self, log_prob: torch.Tensor | None, weight: torch.Tensor, metrics: dict) -> None:
        """After each actor step, with the log-probabilities of its actions and each agent's weight in
        the mean ``[B, A]`` (SAC's temperature step)."""

    # ------------------------------------------------------------------ networks

    def build_critic(self) -> tuple[nn.Module, nn.Module]:
        """A critic and its head: per agent of (observation, action) -> 1, or of (state, joint action)
        -> one Q per agent."""
        group, d = self.group, self.action_size
        if self.cfg.critic_scope == "agent":
            critic = self.shared.model("critic", (flat_size(group.obs_shape) + d,), per_agent=True)
            return critic, init_linear(nn.Linear(critic.out_dim, 1), gain=1.0)
        critic = self.shared.model("critic", (flat_size(self.env.state_shape) + self.n_agents * d,), per_agent=False)
        return critic, init_linear(nn.Linear(critic.out_dim, self.n_agents), gain=1.0)

    def q_values(self, prefix: str, i: int, obs, state, actions) -> torch.Tensor:
        """Critic ``i``'s (``prefix`` "target_": its target's) Q ``[B, A]`` of actions ``[B, A, d]``
        in ``[-1, 1]`` (absent agents' zeroed by the caller) with observations ``[B, A, ...]`` or
        the state ``[B, ...]``."""
        critic, head = self.modules[f"{prefix}critic_{i}"], self.modules[f"{prefix}critic_{i}_head"]
        B = len(actions)
        if self.cfg.critic_scope == "agent":
            x = torch.cat([as_float(obs.reshape(B, self.n_agents, -1)), actions], -1).unsqueeze(0)
            features, _ = self.shared.encode(critic, x, None, None)
            return head(features[0]).squeeze(-1)
        x = torch.cat([as_float(state.reshape(B, -1)), actions.reshape(B, -1)], -1).unsqueeze(0)
        features, _ = critic(x)
        return head(features[0])

    def min_q(self, prefix: str, obs, state, actions) -> torch.Tensor:
        """The smallest of the critics' Q ``[B, A]`` (one critic: its own)."""
        q = self.q_values(prefix, 0, obs, state, actions)
        for i in range(1, self.cfg.n_critics):
            q = torch.minimum(q, self.q_values(prefix, i, obs, state, actions))
        return q

    def head_outputs(self, prefix: str, obs: torch.Tensor, present: torch.Tensor | None) -> torch.Tensor:
        """The (``prefix`` "target_": target) actor head's outputs ``[B, A, policy_outputs]`` for
        observations ``[B, A, ...]``."""
        features, _ = self.shared.encode(self.modules[prefix + "actor"], obs.unsqueeze(0), None, None,
                                         present=None if present is None else present.unsqueeze(0))
        return self.modules[prefix + "actor_head"](features[0])

    def trained_modules(self) -> list[nn.Module]:
        """The critics (the actor has an optimiser of its own)."""
        return [self.modules[k] for k in self.modules if k.startswith("critic_")]

    # ------------------------------------------------------------------ acting

    @torch.inference_mode()
    def act(self, obs, state, agent_mask, action_mask, hidden, explore: bool = True,
            progress: Progress | None = None) -> ActOut:
        """The policy's actions (``explore``: with its noise, from each env's stream), mapped onto the
        Box's bounds; before ``learning_starts`` in training, uniform within them."""
        present = torch.from_numpy(agent_mask).to(self.device)
        out = self.head_outputs("", torch.from_numpy(obs).to(self.device), present)
        noise = StreamNoise(self.streams, 0, self.device)
        explore = explore and progress is not None
        actions, _ = self.policy_actions(out, explore, noise)
        if explore and progress.steps < self.cfg.learning_starts:
            actions = noise.uniform(actions.shape) * 2 - 1
        env_actions = self.action_mid + self.action_half * actions
        shape = (*agent_mask.shape, *self.group.action_space.shape)
        return ActOut(env_actions.reshape(shape).cpu().numpy().astype(np.float32),
                      np.zeros(agent_mask.shape, np.float32))

    # ------------------------------------------------------------------ learning

    def make_replay(self, layout: StorageLayout) -> TransitionReplay:
        return TransitionReplay(layout, self.cfg.buffer_size, self.stores_state(self.cfg))

    def owed_steps(self, batch: ReplayBatch) -> float:
        """``gradient_steps_per_env_step`` for each env step collected."""
        return batch.env_steps * self.cfg.gradient_steps_per_env_step

    def inputs(self, sample: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A batch of transitions (``TransitionReplay.take``, as tensors) with its actions in
        ``[-1, 1]`` ``[B, A, d]`` (absent agents' zeroed), ``present`` and ``bootstrap`` as bools and
        ``weight`` ``[B, A]``: each present agent's share of a loss's mean."""
        B = len(sample["obs"])
        present, bootstrap = sample["agent_mask"].bool(), sample["bootstrap"].bool()
        actions = (sample["actions"].reshape(B, self.n_agents, -1).float() - self.action_mid) / self.action_half
        return {**sample, "present": present, "bootstrap": bootstrap,
                "actions": torch.where(present.unsqueeze(-1), actions.clamp(-1, 1), 0.0),
                "weight": present.float() / present.sum().clamp(min=1)}

    def critic_loss(self, x: dict[str, torch.Tensor], noise) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Every critic's squared TD error against ``r + gamma * (min target Q of the next step's
        actions + the entropy bonus)``, for each present agent; the next step counts where
        ``bootstrap`` says."""
        cfg, bootstrap = self.cfg, x["bootstrap"]
        with torch.no_grad():
            out = self.head_outputs("target_" if self.has_target_actor else "", x["next_obs"], bootstrap)
            next_actions, next_log_prob = self.target_actions(out, noise)
            next_actions = torch.where(bootstrap.unsqueeze(-1), next_actions, 0.0)
            next_q = self.min_q("target_", x["next_obs"], x.get("next_state"), next_actions) + \
                self.entropy_bonus(next_log_prob)
            target = x["reward"].float() + cfg.gamma * torch.where(bootstrap, next_q, 0.0)          # [B, A]
        loss = sum(((self.q_values("", i, x["obs"], x.get("state"), x["actions"]) - target).pow(2) * x["weight"]).sum()
                   for i in range(cfg.n_critics))
        return loss, {"critic_loss": loss.detach(), "target_mean": (target * x["weight"]).sum()}

    def actor_loss(self, x: dict[str, torch.Tensor], noise) -> tuple[torch.Tensor, dict, torch.Tensor | None]:
        """What the policy's step descends, with every present agent's action from the current policy
        (absent agents' zero) -> (loss, metrics, the actions' log-probabilities or None)."""
        out = self.head_outputs("", x["obs"], x["present"])
        actions, log_prob = self.policy_actions(out, self.stochastic, noise)
        actions = torch.where(x["present"].unsqueeze(-1), actions, 0.0)
        # TD3 ascends its first critic; SAC the smaller of its two
        q = self.min_q("", x["obs"], x.get("state"), actions) if self.stochastic else \
            self.q_values("", 0, x["obs"], x.get("state"), actions)
        loss = (self.actor_loss_terms(q, log_prob) * x["weight"]).sum()
        return loss, {"actor_loss": loss.detach(), "q_policy": (q.detach() * x["weight"]).sum()}, log_prob

    def learn(self, samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """A critic step on a batch of transitions, and every ``policy_delay`` steps an actor step."""
        cfg, x, noise = self.cfg, self.inputs(samples[0]), GeneratorNoise(self.generator)
        loss, metrics = self.critic_loss(x, noise)
        gradient_step(self.optimizer, self._clipped, loss, metrics, cfg.max_grad_norm, self.who)
        if (self.gradient_steps + 1) % cfg.policy_delay == 0:
            loss, actor_metrics, log_prob = self.actor_loss(x, noise)
            gradient_step(self.actor_optimizer, self._actor_params, loss, actor_metrics, cfg.max_grad_norm, self.who)
            metrics.update(actor_metrics, actor_grad_norm=actor_metrics.pop("grad_norm", 0.0))
            self.after_actor_step(log_prob, x["weight"], metrics)
        return metrics

    @torch.no_grad()
    def update_targets(self) -> None:
        """After a gradient step: the targets move with the actor, every ``policy_delay`` steps."""
        if self.gradient_steps % self.cfg.policy_delay == 0:
            super().update_targets()

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict:
        return {**super().state_dict(), "actor_optimizer": self.actor_optimizer.state_dict(),
                "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict, weights_only: bool = False) -> None:
        super().load_state_dict(state, weights_only)
        if not weights_only:
            self.actor_optimizer.load_state_dict(state["actor_optimizer"])
            self.generator.set_state(state["generator"])

    def policy_state_dict(self):
        """The actor's weights alone: what a snapshot acts with."""
        return {k: v for k, v in self.modules.state_dict().items() if k.startswith(("actor.", "actor_head."))}

    def load_policy_state_dict(self, state) -> None:
        self.modules.load_state_dict(state, strict=False)

"""The on-policy family: PPO-style agents that learn once from each rollout they collect.

``OnPolicyAgent`` owns what MAPPO, IPPO, MAT and COMA share: rollout storage, GAE advantages
(with value normalisation and masked agent slots), epochs of minibatch updates, the PPO loss sum
and the chunked value pass. An algorithm builds its networks and writes ``policy``, ``values`` and
``loss``, and may override ``sample`` (how ``act`` picks actions), ``estimate_values`` /
``targets`` / ``normalize_advantages`` (the three parts of ``training_data``; ``gae`` is the GAE
they and ``advantage_refresh`` share) and ``after_update``.
Sequence tensors inside are ``[L, B, A, ...]`` (time, batch, agent).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal, Optional

import numpy as np
import torch
from torch import nn

from marlkit.agents.base import ActOut, Agent, Progress
from marlkit.agents.losses import masked_mean, ppo_policy_loss, value_loss
from marlkit.config import ModelConfig, RunnerConfig, value_range
from marlkit.errors import ConfigError, UnknownNameError
from marlkit.memory import MemoryEstimate
from marlkit.random_streams import GeneratorNoise, StreamNoise
from marlkit.networks.normalization import ValueNorm
from marlkit.optim import Adam, gradient_step, gradient_steps
from marlkit.precision import loss_precision, update_precision
from marlkit.registry import get_model
from marlkit.storage import RolloutBatch, RolloutStorage, StorageLayout, gather, minibatches
from marlkit.storage.returns import compute_gae, last_present_value

log = logging.getLogger(__name__)


@dataclass
class OnPolicyConfig:
    """Settings shared by every on-policy agent (PPO-family defaults from the MAPPO paper)."""

    lr: float = field(default=7e-4, metadata=value_range(0.0))
    critic_lr: Optional[float] = field(default=None, metadata=value_range(0.0))
    lr_schedule: Literal["constant", "linear"] = "constant"   # linear: to 0 at runner.total_steps
    gamma: float = field(default=0.99, metadata=value_range(0.0, 1.0))
    gae_lambda: float = field(default=0.95, metadata=value_range(0.0, 1.0))
    clip: float = field(default=0.2, metadata=value_range(0.0))
    value_clip: Optional[float] = field(default=0.2, metadata=value_range(0.0))
    epochs: int = field(default=10, metadata=value_range(1))
    minibatches: int = field(default=1, metadata=value_range(1))
    entropy_coef: float = field(default=0.01, metadata=value_range(0.0))
    value_coef: float = field(default=1.0, metadata=value_range(0.0))
    max_grad_norm: Optional[float] = field(default=10.0, metadata=value_range(0.0))
    huber_delta: Optional[float] = field(default=10.0, metadata=value_range(0.0))
    value_norm: bool = True
    advantage_norm: bool = True
    # recompute the advantages and returns within an update from the values the critic gave each
    # sample in its latest minibatch, so that GAE follows the critic as it learns, at no extra
    # forward pass: "epoch", before every epoch after the first; "minibatch", before every
    # minibatch after the first, samples not yet seen keeping the rollout's values, and the value
    # clip centred on the latest values (PuffeRL's refresh). Only for agents whose advantages are
    # GAE over their own values (not COMA's or POCA's)
    advantage_refresh: Literal["none", "epoch", "minibatch"] = "none"
    # with advantage_refresh: each step's TD error and trace weighed by min(vtrace_clip, ratio), the
    # ratio of the sample's latest minibatch (1 before it has one): V-trace's rho and c, as
    # PuffeRL's advantages (its clips of 1); null: not weighed
    vtrace_clip: Optional[float] = field(default=None, metadata=value_range(0.0))
    use_agent_id: bool = True
    chunk_length: Optional[int] = field(default=None, metadata=value_range(1))
    log_std_init: float = -0.5
    # the update's forward passes: bfloat16 runs convolutions and matmuls in bfloat16 (weights,
    # gradients and the optimiser stay float32; marlkit/precision.py): a convolutional update is
    # faster on a CPU with bfloat16 instructions, much slower on one without (docs/benchmarks.md);
    # auto: bfloat16 where the device computes it natively, else float32; acting stays float32
    precision: Literal["float32", "bfloat16", "auto"] = "float32"
    actor: ModelConfig = field(default_factory=ModelConfig)
    critic: ModelConfig = field(default_factory=ModelConfig)


def known_model(name: str, key: str):
    """The registered model ``name``; an unknown one is a ConfigError naming ``key``."""
    try:
        return get_model(name)
    except UnknownNameError as exc:
        raise ConfigError(f"{key}: {exc}") from None


class OnPolicyAgent(Agent):
    """Rollout collection, GAE and the minibatch update loop shared by on-policy algorithms.

    Subclasses implement ``build`` (return their named modules; one Adam optimiser and every
    checkpoint cover them), ``policy``, ``values`` and ``loss`` (usually through ``ppo_loss``).
    """

    config_cls = OnPolicyConfig
    value_chunk_bytes = 16 * 2**20  # input bytes per critic pass when valuing a rollout

    def __init__(self, group, env, cfg: OnPolicyConfig, seed=0, device="cpu"):
        super().__init__(group, env, cfg, seed, device)
        self.generator = torch.Generator(device=self.device).manual_seed(self.seed)
        torch.manual_seed(self.seed)  # weight initialisation draws from the global generator
        self.modules = nn.ModuleDict(self.build())
        self.value_norm = ValueNorm() if cfg.value_norm else None
        if self.value_norm is not None:
            self.modules["value_norm"] = self.value_norm
        self.modules.to(self.device)
        self.optimizer = Adam(self.param_groups(), eps=1e-5)
        self.precision = update_precision(cfg.precision, self.device)
        self._clipped = list(self.modules.parameters())   # walked once, not per gradient step
        self.base_lrs = [group["lr"] for group in self.optimizer.param_groups]
        self.recurrent = any(getattr(m, "is_recurrent", False) for m in self.modules.modules())
        self.hidden_size = max([getattr(m, "hidden_size", 0) for m in self.modules.modules()] + [0])
        self._refresh: AdvantageRefresh | None = None   # while an update refreshes its advantages

    # ------------------------------------------------------------------ before anything starts

    @classmethod
    def stores_state(cls, cfg, state_from_obs: bool) -> bool:
        """Whether the rollout keeps the global state: an agent that never reads it does not store
        it (``state_from_obs``: ``EnvSpec.state_in_obs_of`` the group, for agents whose choice
        depends on it)."""
        return True

    @property
    def uses_state(self) -> bool:
        return self.stores_state(self.cfg, self.env.state_in_obs_of(self.group.name))

    @classmethod
    def memory_estimate(cls, layout: StorageLayout, cfg, key: str = "") -> MemoryEstimate:
        """The rollout's observations and states in their stored dtypes (uint8 images stay uint8)
        plus the per-agent scalars, twice with ``layout.double``; the update holds one minibatch of
        them as float32, with about three times as much again for activations and gradients, and a
        few ``[T, E, A]`` arrays."""
        group, T, E = layout.group, layout.horizon, layout.num_envs
        A = group.n_agents
        obs = int(np.prod(group.obs_shape, dtype=np.int64))
        stored_state = cls.stores_state(cfg, layout.env.state_in_obs_of(group.name))
        state = int(np.prod(layout.env.state_shape, dtype=np.int64)) if stored_state else 0
        obs_bytes = np.dtype(group.observation_space.dtype or np.float32).itemsize
        per_step = A * obs * obs_bytes + state * np.dtype(layout.env.state_dtype).itemsize + A * (group.n_actions + 32)
        samples = -(-T * E // min(cfg.minibatches, T * E))
        update = samples * (A * obs + state) * 4 * 4 + T * E * A * 4 * 8
        shrink = ("runner.parallels", "runner.horizon", f"{key}.minibatches", "env.resize (for images)")
        copies = 2 if layout.double else 1   # one rollout collected while the last is trained on
        return MemoryEstimate(copies * T * E * per_step, update,
                              (*shrink, "runner.overlap: false") if layout.double else shrink)

    @classmethod
    def require_feed_forward(cls, cfg: OnPolicyConfig, key: str, why: str) -> None:
        """Refuse a recurrent actor or critic for an agent whose networks carry no memory (``why``
        says what computes step by step)."""
        for role in ("actor", "critic"):
            name = getattr(cfg, role).name
            if get_model(name).is_recurrent:
                raise ConfigError(f"{key}.{role}.name: {name!r} is recurrent, but {cls.registered_name}'s {role} is "
                                  f"feed-forward ({why}); use 'mlp' (or 'cnn' for images)")

    @classmethod
    def check_config(cls, cfg: OnPolicyConfig, rc: RunnerConfig, key: str) -> None:
        recurrent = []
        for role in ("actor", "critic"):
            model = getattr(cfg, role)
            model_cls = known_model(model.name, f"{key}.{role}.name")
            if "encoder" in model.kwargs:   # a model built around another one (gru over cnn)
                known_model(model.kwargs["encoder"], f"{key}.{role}.kwargs.encoder")
            if model_cls.is_recurrent:
                recurrent.append((role, model.rnn_hidden))
        if recurrent:
            chunk = cfg.chunk_length or rc.horizon
            if rc.horizon % chunk:
                raise ConfigError(f"{key}.chunk_length={chunk} must divide runner.horizon={rc.horizon}")
        if cfg.advantage_refresh != "none" and cls.targets is not OnPolicyAgent.targets:
            raise ConfigError(f"{key}.advantage_refresh: {cls.registered_name} computes its advantages its own way, "
                              "not by GAE over its values; set it to none")
        if cfg.vtrace_clip is not None and cfg.advantage_refresh == "none":
            raise ConfigError(f"{key}.vtrace_clip={cfg.vtrace_clip} weighs the advantages an update recomputes, and "
                              f"{key}.advantage_refresh is none; set it to minibatch (or epoch), or vtrace_clip to null")
        if len({size for _, size in recurrent}) > 1:
            raise ConfigError(f"{key}: a recurrent actor and critic need the same rnn_hidden, got "
                              + " and ".join(f"{role}.rnn_hidden={size}" for role, size in recurrent))

    # ------------------------------------------------------------------ for subclasses

    def build(self) -> dict[str, nn.Module]:
        raise NotImplementedError

    def param_groups(self) -> list[dict]:
        return [{"params": self.modules.parameters(), "lr": self.cfg.lr}]

    def policy(self, obs, state, hidden, episode_start, action_mask, agent_mask=None):
        """-> (distribution over ``[L, B, A]`` actions, next actor hidden ``[B, A, H]`` or None).
        ``agent_mask`` ``[L, B, A]`` (None: everyone) lets a policy skip absent slots; what it
        gives for them is then arbitrary, since every use masks them out."""
        raise NotImplementedError

    def values(self, obs, state, hidden, episode_start, agent_mask=None):
        """-> (normalised values ``[L, B, A]``, next critic hidden ``[B, A, H]`` or None).
        ``agent_mask`` ``[L, B, A]`` says who is present (a critic that pools over the group reads
        it; None: everyone)."""
        raise NotImplementedError

    def actor_critic_groups(self, actor: list[str], critic: list[str]) -> list[dict]:
        """Two parameter groups: the ``actor`` modules at ``lr``, the ``critic`` ones at ``critic_lr``
        (null: ``lr``); names of modules this agent does not have are skipped."""
        def params(names):
            return [p for name in names if name in self.modules for p in self.modules[name].parameters()]
        return [{"params": params(actor), "lr": self.cfg.lr},
                {"params": params(critic), "lr": self.cfg.critic_lr or self.cfg.lr}]

    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``batch`` holds ``training_data``'s arrays as ``[L, B, ...]``; the agent dimension is kept
        whole, so ``batch["actions"]`` ``[L, B, A, ...]`` is the stored joint action of each sample.
        An actor-critic's: the policy's and the values' passes, then ``ppo_loss``."""
        h_actor, h_critic = self.split_hidden(batch["hidden"][0]) if "hidden" in batch else (None, None)
        action_mask = batch["action_mask"] if self.group.n_actions else None
        dist, _ = self.policy(batch["obs"], batch["state"], h_actor, batch["episode_start"], action_mask,
                              batch["agent_mask"])
        value, _ = self.values(batch["obs"], batch["state"], h_critic, batch["episode_start"], batch["agent_mask"])
        return self.ppo_loss(batch, dist.log_prob(batch["actions"]), dist.entropy, lambda: value)

    def ppo_loss(self, batch: dict[str, torch.Tensor], log_prob: torch.Tensor, entropy: Callable[[], torch.Tensor],
                 value: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """PPO's loss sum over present agents: the clipped surrogate of ``log_prob`` ``[L, B, A]`` of
        the stored actions, the value loss of ``value()`` (normalised, ``[L, B, A]``) against the
        returns, minus the entropy bonus of ``entropy()`` ``[L, B, A]``. The two are called in that
        order, after the surrogate: the order the computation graph is built in fixes the order in
        which backward sums gradients, hence their last bits."""
        cfg = self.cfg
        mask = batch["agent_mask"].float()
        policy_loss, info = ppo_policy_loss(log_prob, batch["log_prob"], batch["advantages"], cfg.clip, mask)
        entropy = masked_mean(entropy(), mask)
        new_value = value()
        if self._refresh is not None:
            self._refresh.record(batch["rows"], new_value, log_prob - batch["log_prob"])
        critic_loss = value_loss(new_value, batch["old_value"], self.normalized_returns(batch["returns"]), mask,
                                 cfg.value_clip, cfg.huber_delta)
        loss = policy_loss + cfg.value_coef * critic_loss - cfg.entropy_coef * entropy
        return loss, {"policy_loss": policy_loss.detach(), "value_loss": critic_loss.detach(),
                      "entropy": entropy.detach(), **info}

    def sample(self, obs, state, agent_mask, action_mask, hidden, explore: bool, noise):
        """Pick actions for ``[1, E, A, ...]`` inputs (``hidden`` is the actor's ``[E, A, H]``),
        drawing from ``noise`` (``marlkit/random_streams.py``; while acting, each env's stream along
        dimension 1). -> (actions ``[1, E, A, ...]``, their log-probs ``[1, E, A]``, next actor hidden
        or None, normalised values ``[1, E, A]`` when picking them computed values anyway, else None)."""
        dist, hidden = self.policy(obs, state, hidden, None, action_mask, agent_mask)
        action = dist.sample(noise) if explore else dist.mode()
        return action, dist.log_prob(action), hidden, None

    def after_update(self, progress: Progress | None) -> None:
        """Runs once after every ``update``'s gradient steps (e.g. a target-network sync)."""

    @contextmanager
    def own_generators(self, seed: int):
        kept = self.generator
        self.generator = torch.Generator(device=self.device).manual_seed(int(seed))
        try:
            with super().own_generators(seed):
                yield
        finally:
            self.generator = kept

    @property
    def critic_acts_online(self) -> bool:
        """A recurrent critic needs its hidden state stepped while acting, so it values online;
        a feed-forward one is evaluated once per rollout in a single batched pass."""
        return self.recurrent

    # ------------------------------------------------------------------ acting

    def initial_hidden(self, num_envs: int) -> np.ndarray | None:
        if not self.recurrent:
            return None
        return np.zeros((num_envs, self.n_agents, 2, self.hidden_size), np.float32)

    @staticmethod
    def split_hidden(hidden: torch.Tensor | None):
        if hidden is None:
            return None, None
        return hidden[..., 0, :], hidden[..., 1, :]

    def _denormalize(self, value: torch.Tensor) -> torch.Tensor:
        return self.value_norm.denormalize(value) if self.value_norm is not None else value

    def tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device)

    @torch.inference_mode()
    def act(self, obs, state, agent_mask, action_mask, hidden, explore: bool = True,
            progress: Progress | None = None) -> ActOut:
        o = self.tensor(obs).unsqueeze(0)
        s = self.tensor(state).unsqueeze(0)
        m = self.tensor(action_mask).unsqueeze(0) if self.group.n_actions else None
        h_actor, h_critic = self.split_hidden(self.tensor(hidden) if hidden is not None else None)
        present = self.tensor(agent_mask).unsqueeze(0)
        action, log_prob, h_actor, v = self.sample(o, s, present, m, h_actor, explore,
                                                   StreamNoise(self.streams, 1, self.device))
        value = next_hidden = None
        if v is None and self.critic_acts_online:
            v, h_critic = self.values(o, s, h_critic, None, present)
        if v is not None:
            value = self._denormalize(v)[0].cpu().numpy()
        if self.recurrent:
            next_hidden = torch.stack([h_actor if h_actor is not None else torch.zeros_like(h_critic),
                                       h_critic if h_critic is not None else torch.zeros_like(h_actor)],
                                      -2).cpu().numpy()
        return ActOut(action[0].cpu().numpy(), log_prob[0].cpu().numpy(), value, next_hidden)

    # ------------------------------------------------------------------ learning

    def make_storage(self, layout: StorageLayout) -> RolloutStorage:
        return RolloutStorage(layout, self.uses_state, (2, self.hidden_size) if self.recurrent else None)

    def chunks(self, n: int, row_bytes: int) -> Iterator[slice]:
        """Consecutive slices of ``n`` rows of ``row_bytes`` input bytes each, about
        ``value_chunk_bytes`` per slice: a rollout of images never goes through a critic in one pass."""
        size = max(1, self.value_chunk_bytes // max(row_bytes, 1))
        return (slice(start, start + size) for start in range(0, n, size))

    @torch.no_grad()
    def value_of(self, obs: np.ndarray, state: np.ndarray, agent_mask: np.ndarray, hidden: np.ndarray | None):
        """Real-scale values ``[N, A]`` of ``N`` steps (one each); ``agent_mask`` ``[N, A]`` says who
        is present (a critic that pools over agents needs it; a per-agent critic does not look)."""
        values = []
        for part in self.chunks(len(obs), obs[:1].nbytes + state[:1].nbytes):
            h = self.split_hidden(self.tensor(hidden[part]))[1] if hidden is not None else None
            v, _ = self.values(self.tensor(obs[part]).unsqueeze(0), self.tensor(state[part]).unsqueeze(0), h, None,
                               self.tensor(agent_mask[part]).unsqueeze(0))
            values.append(self._denormalize(v)[0].cpu().numpy())
        return np.concatenate(values) if values else np.zeros((0, self.n_agents), np.float32)

    def chunk_length(self, horizon: int) -> int:
        """Steps per training sequence: a recurrent agent's ``chunk_length`` (null: the rollout), 1
        for a feed-forward one."""
        return (self.cfg.chunk_length or horizon) if self.recurrent else 1

    def update(self, batch: RolloutBatch, progress: Progress | None = None) -> dict[str, float]:
        rollout = batch.rollout
        if not rollout.full:
            raise RuntimeError(f"update() called on a rollout of {rollout.step} of {rollout.horizon} steps")
        lr_scale = self.lr_scale(progress, batch.num_steps)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base * lr_scale
        try:
            metrics = self.optimise(self.training_data(batch), rollout.horizon, progress)
        finally:
            self._refresh = None
        if self.cfg.lr_schedule != "constant":
            metrics["lr_scale"] = lr_scale
        present = rollout.agent_mask
        if present.any():
            metrics["value_mean"] = float(rollout.value[present].mean())
        self.after_update(progress)
        return metrics

    def lr_scale(self, progress: Progress | None, rollout_steps: int) -> float:
        """The factor on every learning rate for the update on a rollout of ``rollout_steps`` env steps
        (``lr_schedule``): 1 when constant; ``linear`` falls from 1 at the first update towards 0 at
        ``total_steps``, as in CleanRL's PPO. It depends on the progress alone, so a resumed run
        continues the same schedule."""
        if self.cfg.lr_schedule == "constant" or progress is None:
            return 1.0
        before = progress.steps - rollout_steps   # steps collected before this rollout
        return max(1.0 - before / max(progress.total_steps, 1), 0.0)

    def training_data(self, batch: RolloutBatch) -> dict[str, np.ndarray]:
        """Everything ``loss`` sees, as ``[T, E, ...]`` arrays: the stored rollout, ``targets``'
        arrays (advantages, returns, ...) and the episode starts."""
        rollout = batch.rollout
        last_value, truncation_value = self.estimate_values(batch)
        refreshes = {"none": False, "epoch": self.cfg.epochs > 1, "minibatch": True}[self.cfg.advantage_refresh]
        if refreshes:   # until the update's gradient steps end
            self._refresh = AdvantageRefresh(self, batch, last_value, truncation_value)
        targets = self.targets(batch, last_value, truncation_value)
        targets["advantages"] = self.normalize_advantages(rollout, targets["advantages"])
        data = {"obs": rollout.obs, "state": rollout.state, "agent_mask": rollout.agent_mask,
                "action_mask": rollout.action_mask, "actions": rollout.actions, "log_prob": rollout.log_prob,
                **targets, "episode_start": batch.episode_start, **rollout.extras}
        if rollout.hidden is not None:
            data["hidden"] = rollout.hidden
        if self._refresh is not None:
            self._refresh.begin(data)
        return data

    def finals(self, rollout) -> dict[str, np.ndarray] | None:
        """The rollout's truncation finals stacked as ``[N, ...]`` arrays (``t``, ``e``, ``obs``,
        ``state``, ``agent_mask``: the slots present at that step, ``hidden``, ``action_mask``: the
        actions allowed at the final observation), or None if there are none."""
        if not rollout.finals:
            return None
        ts, es, fobs, fstate, fhidden, fmask = zip(*rollout.finals)
        ts, es = np.array(ts), np.array(es)
        return {"t": ts, "e": es, "obs": np.stack(fobs), "state": np.stack(fstate),
                "agent_mask": rollout.agent_mask[ts, es], "hidden": np.stack(fhidden) if self.recurrent else None,
                "action_mask": np.stack(fmask)}

    @torch.no_grad()
    def joint_actions(self, obs, state, agent_mask, action_mask, hidden) -> np.ndarray:
        """The joint actions ``[N, A, ...]`` the current policy picks at ``N`` observations (e.g. the
        bootstrap step or truncation finals, where a Q-critic needs Q(s, u)), among the actions
        ``action_mask`` allows (None: every action)."""
        h_actor = self.split_hidden(self.tensor(hidden))[0] if hidden is not None else None
        m = None
        if self.group.n_actions:
            m = self.tensor(action_mask if action_mask is not None else
                            np.ones(agent_mask.shape + (self.group.n_actions,), bool)).unsqueeze(0)
        action, _, _, _ = self.sample(self.tensor(obs).unsqueeze(0), self.tensor(state).unsqueeze(0),
                                      self.tensor(agent_mask).unsqueeze(0), m, h_actor, True,
                                      GeneratorNoise(self.generator))
        return action[0].cpu().numpy()

    def estimate_values(self, batch: RolloutBatch) -> tuple[np.ndarray, np.ndarray]:
        """Fill ``rollout.value`` (real scale) unless acting did; -> (the bootstrap value ``[E, A]``,
        the truncation values ``[T, E, A]``: the value of each cut slot's final observation)."""
        rollout, bootstrap = batch.rollout, batch.bootstrap
        T, E = rollout.horizon, rollout.num_envs
        if not rollout.has_values:
            flat_obs = rollout.obs.reshape(T * E, *rollout.obs.shape[2:])
            flat_state = rollout.state.reshape(T * E, *rollout.state.shape[2:])
            flat_mask = rollout.agent_mask.reshape(T * E, -1)
            rollout.value[:] = self.value_of(flat_obs, flat_state, flat_mask, None).reshape(T, E, -1)
        last_value = np.where(bootstrap.agent_mask,
                              self.value_of(bootstrap.obs, bootstrap.state, bootstrap.agent_mask, bootstrap.hidden),
                              last_present_value(rollout.value, rollout.agent_mask))
        truncation_value = np.zeros_like(rollout.value)
        finals = self.finals(rollout)
        if finals is not None:
            truncation_value[finals["t"], finals["e"]] = self.value_of(finals["obs"], finals["state"],
                                                                       finals["agent_mask"], finals["hidden"])
        return last_value, truncation_value

    def targets(self, batch: RolloutBatch, last_value: np.ndarray, truncation_value: np.ndarray) -> dict:
        """GAE over ``rollout.value`` -> ``advantages``, ``returns`` (real scale) and ``old_value``
        (normalised, for value clipping); updates the value normaliser with the returns."""
        rollout = batch.rollout
        advantages, returns = self.gae(rollout, rollout.value, last_value, truncation_value)
        old_value = self.tensor(rollout.value)
        if self.value_norm is not None:
            old_value = self.value_norm.normalize(old_value)
            self.value_norm.update(self.tensor(returns[rollout.agent_mask]))
        return {"advantages": advantages, "returns": returns, "old_value": old_value.cpu().numpy()}

    def gae(self, rollout, value: np.ndarray, last_value: np.ndarray, truncation_value: np.ndarray,
            importance: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(advantages, returns) ``[T, E, A]`` of the rollout's rewards over ``value`` (real scale),
        each step weighed by ``importance`` (``compute_gae``)."""
        return compute_gae(rollout.reward, value, rollout.terminated, rollout.truncated, rollout.episode_end,
                           rollout.agent_mask, truncation_value, last_value, self.cfg.gamma, self.cfg.gae_lambda,
                           importance)

    def normalize_advantages(self, rollout, advantages: np.ndarray) -> np.ndarray:
        """Zero mean, unit std over present slots (``advantage_norm``); absent slots get 0."""
        present = rollout.agent_mask
        if self.cfg.advantage_norm and present.any():
            mean, std = advantages[present].mean(), advantages[present].std()
            advantages = np.where(present, (advantages - mean) / (std + 1e-8), 0.0).astype(np.float32)
        return advantages

    def optimise(self, data: dict[str, np.ndarray], horizon: int, progress: Progress | None = None) -> dict[str, float]:
        """``epochs`` passes of minibatch gradient steps on ``loss``; returns the mean metrics.
        A stop request ends the passes at the next minibatch boundary; the metrics then include
        ``update_fraction`` < 1, the share of the gradient steps that ran."""
        cfg = self.cfg
        chunk = self.chunk_length(horizon)
        num_envs = data["agent_mask"].shape[1]
        planned = cfg.epochs * min(cfg.minibatches, (horizon // chunk) * num_envs)
        stop = progress.stop_requested if progress is not None and progress.stop_requested else bool
        who = f"group {self.group.name!r} ({self.registered_name})"

        def step(batch: dict) -> dict:
            with loss_precision(self.device, self.precision):
                loss, metrics = self.loss({k: v.to(self.device) for k, v in batch.items()})
            gradient_step(self.optimizer, self._clipped, loss, metrics, cfg.max_grad_norm, who)
            return metrics

        refresh = self._refresh
        per_minibatch = refresh is not None and cfg.advantage_refresh == "minibatch"

        def batches():
            for epoch in range(cfg.epochs):
                if epoch and refresh is not None and not per_minibatch:
                    refresh.apply(data)
                for i, batch in enumerate(minibatches(data, cfg.minibatches, chunk, self.rng, rows=refresh is not None)):
                    if per_minibatch and (epoch or i):
                        refresh.apply(data)
                        batch.update({k: gather(data[k], batch["rows"]) for k in refresh.KEYS})
                    yield batch

        return gradient_steps(batches(), planned, step, stop)

    def normalized_returns(self, returns: torch.Tensor) -> torch.Tensor:
        return self.value_norm.normalize(returns) if self.value_norm is not None else returns

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict:
        return {**super().state_dict(), "modules": self.modules.state_dict(),
                "optimizer": self.optimizer.state_dict(), "generator": self.generator.get_state(),
                "precision": self.precision}

    def load_state_dict(self, state: dict, weights_only: bool = False) -> None:
        super().load_state_dict(state, weights_only)
        self.modules.load_state_dict(state["modules"])
        if not weights_only:
            self.optimizer.load_state_dict(state["optimizer"])
            self.generator.set_state(state["generator"])
            # a run resumed on another machine updates as it began: `auto` would decide anew there
            began = state.get("precision")
            if self.cfg.precision == "auto" and began is not None and began != self.precision:
                log.warning("agents.%s.precision: auto, resumed in %s as the run began (this device would "
                            "pick %s; set the precision to say which)", self.registered_name, began,
                            self.precision)
                self.precision = began


class AdvantageRefresh:
    """``advantage_refresh``: the values (and, for ``vtrace_clip``, the ratios) each sample got in
    its latest minibatch, and GAE recomputed over them. The bootstrap values the critic computed
    and the truncation values stay those the update began with; an agent absent after the rollout,
    whose bootstrap is its own last value (``last_present_value``), takes it from the refreshed
    values. At epoch grain every sample has a value by the time GAE is recomputed; at minibatch
    grain a sample not yet seen keeps the rollout's value and a ratio of 1, and ``old_value`` (the
    value clip's centre) follows the latest values too."""

    KEYS = ("advantages", "returns", "old_value")   # what apply() rewrites

    def __init__(self, agent: OnPolicyAgent, batch: RolloutBatch, last_value: np.ndarray,
                 truncation_value: np.ndarray):
        self.agent, self.rollout = agent, batch.rollout
        self.per_minibatch = agent.cfg.advantage_refresh == "minibatch"
        self.bootstrap_mask = batch.bootstrap.agent_mask   # [E, A]: where last_value is the critic's
        self.last_value, self.truncation_value = last_value, truncation_value
        T, E, A = self.rollout.value.shape
        # normalised values and log-ratios, a row per (t, e); NaN until a minibatch's loss records them
        self.fresh = torch.full((T * E, A), float("nan"), device=agent.device)
        self.log_ratio = torch.zeros((T * E, A), device=agent.device)
        self.old_value: np.ndarray | None = None

    def begin(self, data: dict[str, np.ndarray]) -> None:
        """Keep the update's own ``old_value`` (normalised before this update's returns moved the
        normaliser): the clip centre of the samples no minibatch has seen yet."""
        self.old_value = data["old_value"]

    def record(self, rows: torch.Tensor, value: torch.Tensor, log_ratio: torch.Tensor) -> None:
        """``value`` ``[L, B, A]`` (normalised) and ``log_ratio`` (new over stored log-probability)
        of the samples at ``rows`` ``[L, B]`` of ``[T * E]``."""
        flat = rows.reshape(-1)
        self.fresh[flat] = value.detach().reshape(-1, value.shape[-1]).float()
        self.log_ratio[flat] = log_ratio.detach().reshape(-1, log_ratio.shape[-1]).float()

    @torch.no_grad()
    def apply(self, data: dict[str, np.ndarray]) -> None:
        """New ``advantages`` (normalised as at the start), ``returns`` and, per minibatch,
        ``old_value`` in ``data``."""
        rollout, agent = self.rollout, self.agent
        shape = rollout.value.shape
        fresh = agent._denormalize(self.fresh).cpu().numpy().reshape(shape)
        present = rollout.agent_mask
        seen = ~np.isnan(fresh)
        if not self.per_minibatch and not seen[present].all():
            raise RuntimeError(f"{agent.registered_name}: advantage_refresh found samples whose values no loss "
                               "recorded; a loss must hand its values to ppo_loss (or set advantage_refresh: none)")
        value = np.where(present & seen, fresh, rollout.value)
        last_value = np.where(self.bootstrap_mask, self.last_value, last_present_value(value, present))
        importance = None
        if agent.cfg.vtrace_clip is not None:
            importance = np.minimum(self.log_ratio.exp().cpu().numpy().reshape(shape), agent.cfg.vtrace_clip)
        advantages, returns = agent.gae(rollout, value, last_value, self.truncation_value, importance)
        data["advantages"] = agent.normalize_advantages(rollout, advantages)
        data["returns"] = returns
        if self.per_minibatch:
            data["old_value"] = np.where(seen, self.fresh.cpu().numpy().reshape(shape), self.old_value)

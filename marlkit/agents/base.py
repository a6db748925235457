"""The agent seen by the runner, and the shared on-policy machinery.

``Agent`` is the whole interface the runner uses: ``act``, ``store``, ``update``, ``state_dict`` /
``load_state_dict``. ``OnPolicyAgent`` collects rollouts, computes GAE advantages (with value
normalisation and masked agent slots) and runs epochs of minibatch updates; an algorithm on top of
it builds its networks and writes ``policy``, ``values`` and ``loss``, and may override the hooks
where it differs: ``sample`` (how ``act`` picks actions), ``estimate_values`` / ``targets`` /
``normalize_advantages`` (the three parts of ``training_data``) and ``after_update``.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from marlkit.buffers import RolloutBuffer, Transition, compute_gae, last_present_value, minibatches
from marlkit.config import OnPolicyConfig, to_plain
from marlkit.errors import CheckpointMismatchError, ConfigError, TrainingDivergedError
from marlkit.memory import MemoryEstimate
from marlkit.networks.noise import EnvStreams, GeneratorNoise, StreamNoise
from marlkit.networks.normalization import ValueNorm
from marlkit.optim import Adam, clip_grad_norm
from marlkit.registry import UnknownNameError, get_model
from marlkit.spec import GroupSpec, action_layout

CHECKPOINT_VERSION = 1


@dataclass
class ActOut:
    """What ``act`` returns for ``E`` envs of one group of ``A`` agents."""

    actions: np.ndarray                 # [E, A, *action_shape]
    log_prob: np.ndarray                # [E, A]
    value: np.ndarray | None = None     # [E, A], None when the agent computes values at update time
    hidden: np.ndarray | None = None    # [E, A, ...] to feed the next act; the runner zeroes reset envs
    extras: dict[str, np.ndarray] = field(default_factory=dict)

    @staticmethod
    def join(parts: list["ActOut"]) -> "ActOut":
        """What acting on consecutive blocks of the envs gave, as one, in env order."""
        def cat(arrays):
            return None if arrays[0] is None else np.concatenate(arrays)
        return ActOut(cat([p.actions for p in parts]), cat([p.log_prob for p in parts]),
                      cat([p.value for p in parts]), cat([p.hidden for p in parts]),
                      {k: cat([p.extras[k] for p in parts]) for k in parts[0].extras})


@dataclass
class Bootstrap:
    """The observation after the last stored step, to value the rollout's tail."""

    obs: np.ndarray           # [E, A, *obs_shape]
    state: np.ndarray         # [E, *state_shape]
    agent_mask: np.ndarray    # [E, A]
    action_mask: np.ndarray   # [E, A, n_actions]
    hidden: np.ndarray | None


@dataclass
class Progress:
    """How far training is when ``update`` runs: env steps collected so far (this rollout
    included) out of the run's ``total_steps``; schedules read ``fraction``. ``stop_requested``
    is asked between gradient steps: when it answers True, the update ends at that minibatch
    boundary (a user's Ctrl+C or SIGTERM must not wait for a long update to finish)."""

    steps: int
    total_steps: int
    stop_requested: Callable[[], bool] | None = None

    @property
    def fraction(self) -> float:
        return min(self.steps / max(self.total_steps, 1), 1.0)


class Agent:
    """Controls one group of agents in ``E`` envs. Subclass and ``@register_agent`` to add one."""

    config_cls: type = OnPolicyConfig
    registered_name: str = ""
    learns = True
    # True when check_group may refuse a group: the runner then asks the env type for its groups
    # before it starts the envs (a Unity scene is launched once for that, and closed)
    checks_groups = False

    def __init__(self, group: GroupSpec, state_shape: tuple[int, ...], cfg, num_envs: int, horizon: int,
                 seed: int = 0, device: str = "cpu", state_dtype=np.float32, state_channels_last: bool | None = None,
                 state_from_obs: bool = False):
        self.group, self.state_shape, self.cfg = group, tuple(state_shape), cfg
        self.state_dtype = np.dtype(state_dtype)
        self.state_channels_last = state_channels_last   # EnvSpec.state_channels_last
        self.state_from_obs = state_from_obs             # EnvSpec.state_from_obs
        self.num_envs, self.horizon, self.device = num_envs, horizon, torch.device(device)
        self.n_agents = group.n_agents
        self.rng = np.random.default_rng(seed)
        self.streams = EnvStreams(seed)   # what acting draws, one stream per env (networks/noise.py)

    @classmethod
    def check_config(cls, cfg, runner, key: str) -> None:
        """Reject settings that cannot work, before any env starts; ``key`` is where ``cfg`` sits
        in the run config (``agents.MAPPO``), for the message."""

    @classmethod
    def memory_estimate(cls, group: GroupSpec, state_shape: tuple[int, ...], cfg, num_envs: int, horizon: int,
                        state_dtype=np.float32, key: str = "", state_from_obs: bool = False) -> MemoryEstimate:
        """What this agent's rollout storage and update will need, from the spec alone (nothing is
        allocated yet); ``key`` is where ``cfg`` sits in the run config, for the settings to shrink."""
        return MemoryEstimate()

    @classmethod
    def check_group(cls, group: GroupSpec) -> None:
        """Reject a group this agent cannot drive (its spaces); see ``checks_groups``."""

    def initial_hidden(self, num_envs: int) -> np.ndarray | None:
        return None

    def act(self, obs, state, agent_mask, action_mask, hidden, explore: bool = True) -> ActOut:
        raise NotImplementedError

    @contextmanager
    def own_generators(self, seed: int):
        """Acting inside draws from streams and generators seeded with ``seed``, and the agent's own
        are left as they were: evaluation episodes cannot change what training draws."""
        kept = self.rng, self.streams
        self.rng, self.streams = np.random.default_rng(seed), EnvStreams(seed)
        try:
            yield
        finally:
            self.rng, self.streams = kept

    @contextmanager
    def acting_on(self, first: int, count: int):
        """``act`` inside sees the envs ``first .. first + count - 1`` alone (``runner.act_batch``):
        it draws from their streams, which go on from where they stop."""
        whole = self.streams
        self.streams = whole.block(first, count)
        try:
            yield
        finally:
            whole.absorb(self.streams)
            self.streams = whole

    def store(self, step: Transition) -> None:
        """Keep one transition; agents that do not learn ignore it."""

    def update(self, bootstrap: Bootstrap, progress: Progress | None = None) -> dict[str, float]:
        """Learn from the stored rollout; returns metrics to log."""
        return {}

    # ------------------------------------------------------------------ overlapped collection

    def behaviour(self) -> "Agent":
        """The agent that acts and stores while this one updates (``runner.overlap``): for an agent
        that learns, a twin acting on a snapshot of its weights, one update old (policy lag 1);
        an agent that does not learn acts as itself."""
        return self

    def take_rollout(self, behaviour: "Agent") -> None:
        """Make the rollout that ``behaviour`` has just stored this agent's, for ``update``; the
        behaviour goes on storing into storage of its own."""

    def sync_behaviour(self, behaviour: "Agent") -> None:
        """Copy this agent's weights, after an update, into ``behaviour``."""

    # ------------------------------------------------------------------ acting in env workers

    def acting_copy(self, first_env: int, num_envs: int) -> "Agent":
        """A copy of this agent that acts on the envs ``first_env .. first_env + num_envs - 1`` in an
        env worker (``runner.act_in_workers``): the same settings and weights, those envs' streams
        where they stand, and (for an agent that learns) rollout storage for them alone. It is
        pickled to the worker."""
        twin = copy.copy(self)
        twin.streams = self.streams.block(first_env, num_envs)
        twin.num_envs = num_envs
        return twin

    def acting_state(self):
        """What an acting copy needs after an update to act as this agent does (its weights); None:
        nothing changes."""
        return None

    def load_acting_state(self, state) -> None:
        """The inverse of ``acting_state``, on an acting copy."""

    def behaviour_state(self, behaviour: "Agent") -> dict | None:
        """What a checkpoint needs of ``behaviour`` besides this agent's own state: where its streams
        stand and the rollout it holds (an overlapped run saves with the next rollout collected)."""
        return None

    def load_behaviour_state(self, behaviour: "Agent", state: dict | None) -> None:
        """The inverse of ``behaviour_state``, onto a fresh ``behaviour()``."""

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict:
        return {"version": CHECKPOINT_VERSION, "agent": self.registered_name, "group": self.group.signature(),
                "config": to_plain(self.cfg), "rng": self.rng.bit_generator.state,
                "streams": self.streams.state_dict()}

    def load_state_dict(self, state: dict, weights_only: bool = False) -> None:
        check_compatible(state, self.registered_name, self.group)
        if not weights_only:
            self.rng.bit_generator.state = state["rng"]
            if "streams" in state:   # checkpoints from before per-env streams go on with fresh ones
                self.streams.load_state_dict(state["streams"])

    def save(self, path: str | Path) -> None:
        torch.save(self.state_dict(), path)

    def load(self, path: str | Path, weights_only: bool = False) -> None:
        self.load_state_dict(torch.load(path, weights_only=False, map_location="cpu"), weights_only)


def check_compatible(state: dict, agent: str, group: GroupSpec) -> None:
    if state.get("version") != CHECKPOINT_VERSION:
        raise CheckpointMismatchError(f"checkpoint version {state.get('version')} is not supported "
                                      f"(this marlkit writes version {CHECKPOINT_VERSION})")
    if state.get("agent") != agent:
        raise CheckpointMismatchError(f"the checkpoint of group {group.name!r} was trained by agent "
                                      f"{state.get('agent')!r}, but this run uses {agent!r}")
    theirs, ours = state.get("group", {}), group.signature()
    if theirs != ours:
        diff = [k for k in ours if theirs.get(k) != ours[k]]
        raise CheckpointMismatchError(
            f"the checkpoint of group {group.name!r} was trained on a different env: "
            + "; ".join(f"{k} was {theirs.get(k)!r}, now {ours[k]!r}" for k in diff)
            + "; use the env settings it was trained with (config.yaml beside the checkpoint)")


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over present agents; ``where`` rather than a product, so NaN/inf in an absent slot
    cannot leak in."""
    return torch.where(mask.bool(), x, 0.0).sum() / mask.sum().clamp(min=1.0)


def _known_model(name: str, key: str):
    try:
        return get_model(name)
    except UnknownNameError as exc:
        raise ConfigError(f"{key}: {exc}") from None


class OnPolicyAgent(Agent):
    """Rollout collection, GAE and the minibatch update loop shared by on-policy algorithms.

    Subclasses implement ``build`` (return their named modules; one Adam optimiser and every
    checkpoint cover them), ``policy``, ``values`` and ``loss``. Sequence tensors inside are
    ``[L, B, A, ...]`` (time, batch, agent).
    """

    value_chunk_bytes = 16 * 2**20  # input bytes per critic pass when valuing a rollout

    def __init__(self, group, state_shape, cfg: OnPolicyConfig, num_envs, horizon, seed=0, device="cpu",
                 state_dtype=np.float32, state_channels_last=None, state_from_obs=False):
        super().__init__(group, state_shape, cfg, num_envs, horizon, seed, device, state_dtype, state_channels_last,
                         state_from_obs)
        self.seed = int(seed)
        self.generator = torch.Generator(device=self.device).manual_seed(self.seed)
        torch.manual_seed(self.seed)  # weight initialisation draws from the global generator
        self.modules = nn.ModuleDict(self.build())
        self.value_norm = ValueNorm() if cfg.value_norm else None
        if self.value_norm is not None:
            self.modules["value_norm"] = self.value_norm
        self.modules.to(self.device)
        self.optimizer = Adam(self.param_groups(), eps=1e-5)
        self._clipped = list(self.modules.parameters())   # walking the module tree costs ~1% of a small update
        self.base_lrs = [group["lr"] for group in self.optimizer.param_groups]
        self.recurrent = any(getattr(m, "is_recurrent", False) for m in self.modules.modules())
        self.hidden_size = max([getattr(m, "hidden_size", 0) for m in self.modules.modules()] + [0])
        self.chunk_length = (cfg.chunk_length or horizon) if self.recurrent else 1
        action_shape, action_dtype = action_layout(group.action_space)
        self.buffer = RolloutBuffer(horizon, num_envs, group.n_agents, group.obs_shape,
                                    group.observation_space.dtype or np.float32,
                                    self.state_shape if self.uses_state else None, action_shape,
                                    action_dtype, group.n_actions,
                                    (2, self.hidden_size) if self.recurrent else None, self.state_dtype)
        self._episode_start = np.ones((num_envs, group.n_agents), bool)

    @classmethod
    def stores_state(cls, cfg, state_from_obs: bool) -> bool:
        """Whether the rollout keeps the global state: an agent that never reads it does not store
        it (``state_from_obs``: ``EnvSpec.state_from_obs``, for agents whose choice depends on it)."""
        return True

    @property
    def uses_state(self) -> bool:
        return self.stores_state(self.cfg, self.state_from_obs)

    @classmethod
    def memory_estimate(cls, group, state_shape, cfg, num_envs, horizon, state_dtype=np.float32, key="",
                        state_from_obs=False):
        """The rollout's observations and states in their stored dtypes (uint8 images stay uint8)
        plus the per-agent scalars; the update holds one minibatch of them as float32, with about
        three times as much again for activations and gradients, and a few ``[T, E, A]`` arrays."""
        T, E, A = horizon, num_envs, group.n_agents
        obs = int(np.prod(group.obs_shape, dtype=np.int64))
        state = int(np.prod(state_shape, dtype=np.int64)) if cls.stores_state(cfg, state_from_obs) else 0
        obs_bytes = np.dtype(group.observation_space.dtype or np.float32).itemsize
        per_step = A * obs * obs_bytes + state * np.dtype(state_dtype).itemsize + A * (group.n_actions + 32)
        samples = -(-T * E // min(cfg.minibatches, T * E))
        update = samples * (A * obs + state) * 4 * 4 + T * E * A * 4 * 8
        return MemoryEstimate(T * E * per_step, update, ("runner.parallels", "runner.horizon", f"{key}.minibatches",
                                                        "env.resize (for images)"))

    @classmethod
    def check_config(cls, cfg: OnPolicyConfig, runner, key: str) -> None:
        recurrent = []
        for role in ("actor", "critic"):
            model = getattr(cfg, role)
            model_cls = _known_model(model.name, f"{key}.{role}.name")
            if "encoder" in model.kwargs:   # a model built around another one (gru over cnn)
                _known_model(model.kwargs["encoder"], f"{key}.{role}.kwargs.encoder")
            if model_cls.is_recurrent:
                recurrent.append((role, model.rnn_hidden))
        if recurrent:
            chunk = cfg.chunk_length or runner.horizon
            if runner.horizon % chunk:
                raise ConfigError(f"{key}.chunk_length={chunk} must divide runner.horizon={runner.horizon}")
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

    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``batch`` holds ``training_data``'s arrays as ``[L, B, ...]``; the agent dimension is kept
        whole, so ``batch["actions"]`` ``[L, B, A, ...]`` is the stored joint action of each sample."""
        raise NotImplementedError

    def sample(self, obs, state, agent_mask, action_mask, hidden, explore: bool, noise):
        """Pick actions for ``[1, E, A, ...]`` inputs (``hidden`` is the actor's ``[E, A, H]``),
        drawing from ``noise`` (``marlkit/networks/noise.py``; while acting, each env's stream along
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
    def act(self, obs, state, agent_mask, action_mask, hidden, explore: bool = True) -> ActOut:
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

    def store(self, step: Transition) -> None:
        self.buffer.add(step)

    # ------------------------------------------------------------------ overlapped collection

    BEHAVIOUR_SEED = 7_919   # offsets the behaviour's streams from the agent's own

    def behaviour(self) -> "OnPolicyAgent":
        """A twin of this agent for acting while it updates: an acting copy for all its envs
        (weights copied, ``sync_behaviour`` refreshes them), with env streams of its own."""
        twin = self.acting_copy(0, self.num_envs)
        twin.streams = EnvStreams(self.seed + self.BEHAVIOUR_SEED)
        return twin

    def acting_copy(self, first_env: int, num_envs: int) -> "OnPolicyAgent":
        """The same class and settings, weights copied, the streams of those envs and a rollout
        buffer for them alone; no optimiser and none of the learner's generators: it never learns."""
        skip = {id(self.optimizer): None, id(self.buffer): None, id(self.generator): None, id(self.rng): None}
        twin = copy.deepcopy(self, skip)
        twin.buffer = self.buffer.for_envs(num_envs)
        twin.streams = self.streams.block(first_env, num_envs)
        twin.num_envs = num_envs
        twin.modules.requires_grad_(False)
        return twin

    def acting_state(self) -> dict[str, torch.Tensor]:
        return self.modules.state_dict()

    def load_acting_state(self, state: dict[str, torch.Tensor]) -> None:
        self.modules.load_state_dict(state)

    def take_rollout(self, behaviour: "OnPolicyAgent") -> None:
        if behaviour is not self:
            self.buffer, behaviour.buffer = behaviour.buffer, self.buffer
            behaviour.buffer.reset()

    def sync_behaviour(self, behaviour: "OnPolicyAgent") -> None:
        if behaviour is not self:
            behaviour.load_acting_state(self.acting_state())

    def behaviour_state(self, behaviour: "OnPolicyAgent") -> dict | None:
        if behaviour is self:
            return None
        return {"streams": behaviour.streams.state_dict(),
                "buffer": behaviour.buffer if behaviour.buffer.full else None}   # a rollout cut short is not kept

    def load_behaviour_state(self, behaviour: "OnPolicyAgent", state: dict | None) -> None:
        if state is None:
            return
        if behaviour is not self and "streams" in state:   # resumed without overlap, the agent acts as itself
            behaviour.streams.load_state_dict(state["streams"])
        if state["buffer"] is not None:
            behaviour.buffer = state["buffer"]

    # ------------------------------------------------------------------ learning

    @torch.no_grad()
    def _value_of(self, obs: np.ndarray, state: np.ndarray, agent_mask: np.ndarray,
                  hidden: np.ndarray | None) -> np.ndarray:
        """Real-scale values of ``[N, A, ...]`` observations (one step each), valued in chunks of
        about ``value_chunk_bytes`` of input, so that a rollout of images never goes through the
        critic in one pass."""
        n = len(obs)
        per_step = max(obs[:1].nbytes + state[:1].nbytes, 1)
        chunk = max(1, self.value_chunk_bytes // per_step)
        values = []
        for start in range(0, n, chunk):
            part = slice(start, start + chunk)
            h = self.split_hidden(self.tensor(hidden[part]))[1] if hidden is not None else None
            v, _ = self.values(self.tensor(obs[part]).unsqueeze(0), self.tensor(state[part]).unsqueeze(0), h, None,
                               self.tensor(agent_mask[part]).unsqueeze(0))
            values.append(self._denormalize(v)[0].cpu().numpy())
        return np.concatenate(values) if values else np.zeros((0, self.n_agents), np.float32)

    def update(self, bootstrap: Bootstrap, progress: Progress | None = None) -> dict[str, float]:
        if not self.buffer.full:
            raise RuntimeError(f"update() called after {self.buffer.step} of {self.buffer.horizon} steps")
        data = self.training_data(bootstrap)
        lr_scale = self.lr_scale(progress)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base * lr_scale
        metrics = self.optimise(data, progress)
        if self.cfg.lr_schedule != "constant":
            metrics["lr_scale"] = lr_scale
        present = self.buffer.agent_mask
        if present.any():
            metrics["value_mean"] = float(self.buffer.value[present].mean())
        self.after_update(progress)
        self.buffer.reset()
        return metrics

    def lr_scale(self, progress: Progress | None) -> float:
        """The factor on every learning rate for this update (``lr_schedule``): 1 when constant;
        ``linear`` falls from 1 at the first update towards 0 at ``total_steps``, as in CleanRL's
        PPO. It depends on the progress alone, so a resumed run continues the same schedule."""
        if self.cfg.lr_schedule == "constant" or progress is None:
            return 1.0
        before = progress.steps - self.horizon * self.num_envs   # steps collected before this rollout
        return max(1.0 - before / max(progress.total_steps, 1), 0.0)

    def training_data(self, bootstrap: Bootstrap) -> dict[str, np.ndarray]:
        """Everything ``loss`` sees, as ``[T, E, ...]`` arrays: the stored rollout, ``targets``'
        arrays (advantages, returns, ...) and the episode starts."""
        buf = self.buffer
        episode_start = buf.episode_start(self._episode_start)
        self._episode_start = buf.ends()[-1]
        last_value, truncation_value = self.estimate_values(bootstrap)
        targets = self.targets(bootstrap, last_value, truncation_value)
        targets["advantages"] = self.normalize_advantages(targets["advantages"])
        data = {"obs": buf.obs, "state": buf.state, "agent_mask": buf.agent_mask, "action_mask": buf.action_mask,
                "actions": buf.actions, "log_prob": buf.log_prob, **targets, "episode_start": episode_start,
                **buf.extras}
        if buf.hidden is not None:
            data["hidden"] = buf.hidden
        return data

    def finals(self) -> dict[str, np.ndarray] | None:
        """The rollout's truncation finals stacked as ``[N, ...]`` arrays (``t``, ``e``, ``obs``,
        ``state``, ``agent_mask``: the slots present at that step, ``hidden``, ``action_mask``: the
        actions allowed at the final observation), or None if there are none."""
        buf = self.buffer
        if not buf.finals:
            return None
        ts, es, fobs, fstate, fhidden, fmask = zip(*buf.finals)
        ts, es = np.array(ts), np.array(es)
        return {"t": ts, "e": es, "obs": np.stack(fobs), "state": np.stack(fstate),
                "agent_mask": buf.agent_mask[ts, es], "hidden": np.stack(fhidden) if self.recurrent else None,
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

    def value_of(self, obs: np.ndarray, state: np.ndarray, agent_mask: np.ndarray, hidden: np.ndarray | None):
        """Real-scale values ``[N, A]`` of ``N`` steps; ``agent_mask`` ``[N, A]`` says who is present
        (a critic that pools over agents needs it; a per-agent critic does not look)."""
        return self._value_of(obs, state, agent_mask, hidden)

    def estimate_values(self, bootstrap: Bootstrap) -> tuple[np.ndarray, np.ndarray]:
        """Fill ``buffer.value`` (real scale) unless acting did; -> (the bootstrap value ``[E, A]``,
        the truncation values ``[T, E, A]``: the value of each cut slot's final observation)."""
        buf = self.buffer
        T, E = buf.horizon, buf.num_envs
        if not buf.has_values:
            flat_obs = buf.obs.reshape(T * E, *buf.obs.shape[2:])
            flat_state = buf.state.reshape(T * E, *buf.state.shape[2:])
            flat_mask = buf.agent_mask.reshape(T * E, -1)
            buf.value[:] = self.value_of(flat_obs, flat_state, flat_mask, None).reshape(T, E, -1)
        last_value = np.where(bootstrap.agent_mask,
                              self.value_of(bootstrap.obs, bootstrap.state, bootstrap.agent_mask, bootstrap.hidden),
                              last_present_value(buf.value, buf.agent_mask))
        truncation_value = np.zeros_like(buf.value)
        finals = self.finals()
        if finals is not None:
            truncation_value[finals["t"], finals["e"]] = self.value_of(finals["obs"], finals["state"],
                                                                       finals["agent_mask"], finals["hidden"])
        return last_value, truncation_value

    def targets(self, bootstrap: Bootstrap, last_value: np.ndarray, truncation_value: np.ndarray) -> dict:
        """GAE over ``buffer.value`` -> ``advantages``, ``returns`` (real scale) and ``old_value``
        (normalised, for value clipping); updates the value normaliser with the returns."""
        buf, cfg = self.buffer, self.cfg
        advantages, returns = compute_gae(buf.reward, buf.value, buf.terminated, buf.truncated, buf.episode_end,
                                          buf.agent_mask, truncation_value, last_value, cfg.gamma, cfg.gae_lambda)
        old_value = self.tensor(buf.value)
        if self.value_norm is not None:
            old_value = self.value_norm.normalize(old_value)
            self.value_norm.update(self.tensor(returns[buf.agent_mask]))
        return {"advantages": advantages, "returns": returns, "old_value": old_value.cpu().numpy()}

    def normalize_advantages(self, advantages: np.ndarray) -> np.ndarray:
        """Zero mean, unit std over present slots (``advantage_norm``); absent slots get 0."""
        present = self.buffer.agent_mask
        if self.cfg.advantage_norm and present.any():
            mean, std = advantages[present].mean(), advantages[present].std()
            advantages = np.where(present, (advantages - mean) / (std + 1e-8), 0.0).astype(np.float32)
        return advantages

    def optimise(self, data: dict[str, np.ndarray], progress: Progress | None = None) -> dict[str, float]:
        """``epochs`` passes of minibatch gradient steps on ``loss``; returns the mean metrics.
        A stop request ends the passes at the next minibatch boundary; the metrics then include
        ``update_fraction`` < 1, the share of the gradient steps that ran."""
        cfg = self.cfg
        totals: dict[str, float] = {}
        count = 0
        planned = cfg.epochs * min(cfg.minibatches, (self.horizon // self.chunk_length) * self.num_envs)
        stop = progress.stop_requested if progress is not None and progress.stop_requested else bool
        for batch in (b for _ in range(cfg.epochs) for b in minibatches(data, cfg.minibatches, self.chunk_length,
                                                                         self.rng)):
            if stop():
                break
            loss, metrics = self.loss({k: v.to(self.device) for k, v in batch.items()})
            if not torch.isfinite(loss):
                raise TrainingDivergedError(
                    f"group {self.group.name!r} ({self.registered_name}): the loss became {loss.item()} "
                    f"({', '.join(f'{k}={v.item():.4g}' for k, v in metrics.items())}); lower the learning "
                    "rate or check the env's rewards/observations for NaN or inf")
            self.optimizer.zero_grad()
            loss.backward()
            if cfg.max_grad_norm is not None:
                norm = clip_grad_norm(self._clipped, cfg.max_grad_norm)
                if not math.isfinite(float(norm)):
                    raise TrainingDivergedError(f"group {self.group.name!r} ({self.registered_name}): "
                                                f"the gradient norm became {float(norm)}")
                metrics["grad_norm"] = norm
            self.optimizer.step()
            for k, v in metrics.items():
                totals[k] = totals.get(k, 0.0) + float(v)
            count += 1
        metrics = {k: v / max(count, 1) for k, v in totals.items()}
        if count < planned:
            metrics["update_fraction"] = count / planned
        return metrics

    def normalized_returns(self, returns: torch.Tensor) -> torch.Tensor:
        return self.value_norm.normalize(returns) if self.value_norm is not None else returns

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict:
        return {**super().state_dict(), "modules": self.modules.state_dict(),
                "optimizer": self.optimizer.state_dict(), "generator": self.generator.get_state(),
                "episode_start": self._episode_start.copy()}

    def load_state_dict(self, state: dict, weights_only: bool = False) -> None:
        super().load_state_dict(state, weights_only)
        self.modules.load_state_dict(state["modules"])
        if not weights_only:
            self.optimizer.load_state_dict(state["optimizer"])
            self.generator.set_state(state["generator"])
            # [E] in checkpoints from before per-agent episode starts
            start = state["episode_start"]
            self._episode_start = np.broadcast_to(start.reshape(len(start), -1), self._episode_start.shape).copy()

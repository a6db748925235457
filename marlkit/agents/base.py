"""The agent seen by the runner: the contract every algorithm family implements.

An agent controls one group of agents. The runner and its collector use it through:

- ``act(obs, state, agent_mask, action_mask, hidden, explore, progress)`` -> :class:`ActOut`;
- ``make_storage(layout)``: the storage its family learns from (a rollout learned from once, or a
  replay of episodes), which the collector fills and turns into a batch at each rollout boundary;
- ``schedule``: when it learns (env steps before the first update);
- ``join_team(members)``: a team of several groups, each with an agent of one class, learns as one;
- ``update(batch, progress)`` -> metrics, on what the storage gave;
- ``snapshot(first_env, num_envs)``, ``policy_state_dict()`` / ``load_policy_state_dict()``: an acting copy
  (the policy the collector, an env worker or Ray's driver acts with) and the weights that bring it
  up to date after an update;
- ``state_dict()`` / ``load_state_dict()``, ``save`` / ``load``: weights, optimiser and settings,
  versioned.

The family modules write the shared math once: ``agents/on_policy.py`` (PPO-style: MAPPO, IPPO,
MAT, COMA) and ``agents/off_policy.py`` (a replay and owed gradient steps; its Q-learners, IQL, VDN
and QMIX, in ``agents/value_decomposition.py``). Both take their gradient steps in one loop
(``optim.gradient_steps``).
"""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from marlkit.config import ModelConfig, RunnerConfig, to_plain
from marlkit.errors import CheckpointMismatchError, ConfigError, UnknownNameError
from marlkit.memory import MemoryEstimate
from marlkit.random_streams import EnvStreams
from marlkit.registry import get_model
from marlkit.spec import EnvSpec, GroupSpec
from marlkit.storage import Storage, StorageLayout

CHECKPOINT_VERSION = 2


@dataclass
class ActOut:
    """What ``act`` returns for ``E`` envs of one group of ``A`` agents."""

    actions: np.ndarray                 # [E, A, *action_shape]
    log_prob: np.ndarray                # [E, A]
    value: np.ndarray | None = None     # [E, A], None when the agent computes values at update time
    hidden: np.ndarray | None = None    # [E, A, ...] to feed the next act; the collector zeroes reset envs
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
class Progress:
    """How far training is: env steps collected so far (when ``update`` runs, this rollout included)
    out of the run's ``total_steps``; schedules (a learning rate's, an exploration rate's) read
    ``fraction`` or ``steps``. ``stop_requested`` is asked between gradient steps: when it answers
    True, the update ends at that minibatch boundary (a user's Ctrl+C or SIGTERM must not wait for a
    long update to finish)."""

    steps: int
    total_steps: int
    stop_requested: Callable[[], bool] | None = None

    @property
    def fraction(self) -> float:
        return min(self.steps / max(self.total_steps, 1), 1.0)


@dataclass(frozen=True)
class Schedule:
    """When an agent learns, from its config: the runner updates it once per rollout
    (``runner.horizon`` steps of every env), from ``learning_starts`` env steps on; before that,
    rollouts only fill its storage."""

    learning_starts: int = 0


class Agent:
    """Controls one group of agents. Subclass (or subclass a family) and ``@register_agent``.

    ``env`` is the spec of the env the group lives in: its global state's shape, dtype and layout,
    and whether the state was built from the observations (``EnvSpec.state_from_obs``)."""

    config_cls: type = type(None)
    registered_name: str = ""
    learns = True
    modules: nn.ModuleDict | None = None   # the networks a checkpoint and a snapshot carry
    precision = "float32"   # what the update computes in (on-policy agents: their resolved ``precision`` key)
    # True when check_group may refuse a group: the runner then asks the env type for its groups
    # before it starts the envs (a Unity scene is launched once for that, and closed)
    checks_groups = False

    def __init__(self, group: GroupSpec, env: EnvSpec, cfg, seed: int = 0, device: str = "cpu"):
        self.group, self.env, self.cfg = group, env, cfg
        self.state_shape = tuple(env.state_shape)
        self.state_dtype = np.dtype(env.state_dtype)
        self.n_agents = group.n_agents
        self.seed = int(seed)
        self.device = torch.device(device)
        self.rng = np.random.default_rng(seed)
        self.streams = EnvStreams(seed)   # what acting draws, one stream per env (marlkit/random_streams.py)

    # ------------------------------------------------------------------ before anything starts

    @classmethod
    def check_config(cls, cfg, rc: RunnerConfig, key: str) -> None:
        """Reject settings that cannot work, before any env starts; ``key`` is where ``cfg`` sits
        in the run config (``agents.MAPPO``), for the message."""

    @classmethod
    def update_bound(cls, cfg) -> bool:
        """Whether one of this agent's networks (its ``ModelConfig`` settings) is ``update_bound``:
        convolutions, whose update bounds a CPU run rather than collection."""
        if not dataclasses.is_dataclass(cfg):
            return False
        models = [getattr(cfg, f.name) for f in dataclasses.fields(cfg)]
        return any(isinstance(m, ModelConfig) and _bounds_the_update(m) for m in models)

    @classmethod
    def check_group(cls, group: GroupSpec) -> None:
        """Reject a group this agent cannot drive (its spaces); see ``checks_groups``."""

    @classmethod
    def join_team(cls, members: dict[str, "Agent"]) -> None:
        """The agents of one team's groups (``EnvSpec.teams``), all of this class and learning,
        in group order, built and before any weights are loaded: a family that learns a team's
        value across groups (a mixer over all their agents) ties them here. By default each group
        learns on its own."""

    @classmethod
    def memory_estimate(cls, layout: StorageLayout, cfg, key: str = "") -> MemoryEstimate:
        """What this agent's storage and update will need, from the layout alone (nothing is
        allocated yet); ``key`` is where ``cfg`` sits in the run config, for the settings to shrink."""
        return MemoryEstimate()

    @classmethod
    def schedule_of(cls, cfg) -> Schedule:
        """The schedule ``cfg`` declares (a classmethod: the runner reads it before agents exist)."""
        return Schedule()

    @property
    def schedule(self) -> Schedule:
        return self.schedule_of(self.cfg)

    # ------------------------------------------------------------------ acting

    def initial_hidden(self, num_envs: int) -> np.ndarray | None:
        return None

    def act(self, obs, state, agent_mask, action_mask, hidden, explore: bool = True,
            progress: Progress | None = None) -> ActOut:
        """Actions for ``E`` envs: ``obs`` ``[E, A, ...]``, ``state`` ``[E, ...]``, ``agent_mask``
        ``[E, A]``, ``action_mask`` ``[E, A, n_actions]``, ``hidden`` ``[E, A, ...]`` or None.
        ``explore``: sample (training) or take the most likely action (evaluation, where the config
        asks); ``progress`` (None outside training) drives exploration schedules. Random draws come
        from ``self.streams``, one stream per env."""
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

    # ------------------------------------------------------------------ the acting snapshot

    # what an acting copy leaves out: the learner's optimiser and generators
    learner_only = ("optimizer", "generator", "rng")

    def snapshot(self, first_env: int = 0, num_envs: int | None = None, device: str | None = None) -> "Agent":
        """A copy of this agent that acts on the envs ``first_env ..`` (all of them: None) and never
        learns: the same settings and weights (``modules``, if it has any), on ``device`` (None: the
        agent's), those envs' streams where they stand, none of ``learner_only``. The collector acts
        with one (so the agent may update while it collects, ``runner.overlap``), and env workers
        with one for their block each (pickled to them; on the CPU, whatever device the update runs
        on)."""
        twin = copy.deepcopy(self, {id(getattr(self, name)): None for name in self.learner_only if hasattr(self, name)})
        twin.streams = self.streams.block(first_env, num_envs) if num_envs is not None else \
            copy.deepcopy(self.streams)
        if device is not None:
            twin.device = torch.device(device)
        if self.modules is not None:
            twin.modules.requires_grad_(False).to(twin.device)
        return twin

    def policy_state_dict(self):
        """What a snapshot needs after an update to act as this agent does: its weights (None for an
        agent without ``modules``: nothing changes)."""
        return self.modules.state_dict() if self.modules is not None else None

    def load_policy_state_dict(self, state) -> None:
        """The inverse of ``policy_state_dict``, on a snapshot."""
        if state is not None:
            self.modules.load_state_dict(state)

    # ------------------------------------------------------------------ learning

    def make_storage(self, layout: StorageLayout) -> Storage | None:
        """The storage this agent learns from (None: it does not learn)."""
        return None

    def update(self, batch, progress: Progress | None = None) -> dict[str, float]:
        """Learn from what the storage gave (``Storage.finish``); returns metrics to log."""
        return {}

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict:
        """Settings, the learner's generator and where the agent's own acting streams stand (what it
        draws when it acts itself; the collector's snapshot keeps streams of its own)."""
        return {"version": CHECKPOINT_VERSION, "agent": self.registered_name, "group": self.group.signature(),
                "config": to_plain(self.cfg), "rng": self.rng.bit_generator.state,
                "streams": self.streams.state_dict()}

    def load_state_dict(self, state: dict, weights_only: bool = False) -> None:
        check_compatible(state, self.registered_name, self.group)
        if not weights_only:
            self.rng.bit_generator.state = state["rng"]
            self.streams.load_state_dict(state["streams"])

    def save(self, path: str | Path) -> None:
        torch.save(self.state_dict(), path)

    def load(self, path: str | Path, weights_only: bool = False) -> None:
        self.load_state_dict(torch.load(path, weights_only=False, map_location="cpu"), weights_only)


def _bounds_the_update(model: ModelConfig) -> bool:
    try:
        return get_model(model.name).bounds_the_update(model)
    except UnknownNameError:   # refused with its message when the agent builds the model
        return False


def check_compatible(state: dict, agent: str, group: GroupSpec) -> None:
    if state.get("version") != CHECKPOINT_VERSION:
        raise CheckpointMismatchError(f"checkpoint version {state.get('version')} is not supported "
                                      f"(this marlkit writes version {CHECKPOINT_VERSION}); train it again, "
                                      "or use the marlkit release that wrote it")
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


def require_discrete(agent: str, group: GroupSpec) -> None:
    """Refuse a group whose actions are not Discrete, for an agent that learns one value per action
    (COMA's critic, a Q-network), naming the fix: a MultiDiscrete space can be flattened into one
    Discrete over the joint choices (with its mask), or the group run by an agent that takes it."""
    space = group.action_space
    if isinstance(space, spaces.Discrete):
        return
    flatten = "set env.flatten_actions: true (one Discrete over the joint choices, masked), or " \
        if isinstance(space, spaces.MultiDiscrete) else ""
    raise ConfigError(
        f"agents.{agent}: {agent} needs Discrete actions (it learns one value per action), but group {group.name!r} "
        f"has {space}; {flatten}run that group with MAPPO or IPPO (groups: {{{group.name}: {{agent: MAPPO}}}})")

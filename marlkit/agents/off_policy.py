"""The off-policy family: agents that learn from a replay of all they collected: the Q-learners
(IQL, VDN, QMIX, on a replay of whole episodes) and the actor-critics of continuous actions
(MADDPG, MATD3, MASAC, IDDPG, ISAC, on a replay of transitions).

``OffPolicyAgent`` owns what they share, as ``agents/on_policy.py`` does for PPO's family: the
replay (``make_replay``: ``storage/replay.py`` or ``storage/transitions.py``), the gradient steps
owed to what each rollout collected (``owed_steps``; none before the replay holds a batch) and
their stop-aware loop with averaged metrics (``optim.gradient_steps``), the target networks (every
module ``x`` with a ``target_x`` beside it: copied every ``target_update_interval`` gradient
steps, or moved ``target_update_tau`` of the way after each), one Adam over the online networks,
and the checkpoint of its counters. An algorithm builds its networks, acts, and writes ``loss`` on
what each gradient step draws (or ``learn``, where a step is several losses, each with its own
optimiser); it may learn for the agents of other groups too (``learns_for``: a team's,
``Agent.join_team``), on the same draws of each group's replay.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch
from torch import nn

from marlkit.agents.base import Agent, Progress, Schedule
from marlkit.config import value_range
from marlkit.optim import Adam, gradient_step, gradient_steps
from marlkit.storage import EpisodeReplay, ReplayBatch, StorageLayout, TransitionReplay


@dataclass
class OffPolicyConfig:
    """Settings every off-policy agent shares (EPyMARL's defaults); ``batch_size`` and
    ``buffer_size`` count what the family's replay holds (episodes, or transitions)."""

    lr: float = field(default=5e-4, metadata=value_range(0.0))
    gamma: float = field(default=0.99, metadata=value_range(0.0, 1.0))
    batch_size: int = field(default=32, metadata=value_range(1))            # what the replay holds, per gradient step
    buffer_size: int = field(default=5000, metadata=value_range(1))         # what the replay holds
    learning_starts: int = field(default=0, metadata=value_range(0))        # env steps before the first update
    target_update_interval: int = field(default=200, metadata=value_range(1))   # gradient steps
    # soft updates instead (EPyMARL's target_update_interval_or_tau below 1): after every gradient
    # step the targets move this fraction of the way to the online networks; null: hard copies
    target_update_tau: Optional[float] = field(default=None, metadata=value_range(0.0, 1.0))
    max_grad_norm: Optional[float] = field(default=10.0, metadata=value_range(0.0))


class OffPolicyAgent(Agent):
    """The replay, the owed gradient steps, target networks and their checkpoint; subclasses set
    ``self.modules`` and call ``set_optimizer`` in their ``__init__``, and write ``make_replay``,
    ``owed_steps`` and ``loss`` (or ``learn``)."""

    config_cls = OffPolicyConfig
    replay_unit = "episodes"   # what the replay holds, as its metric names it (``replay_episodes``)
    # what an acting copy leaves out besides the learner's own: the agents it learns for, its replay
    learner_only = (*Agent.learner_only, "learns_for", "replay")

    def __init__(self, group, env, cfg: OffPolicyConfig, seed=0, device="cpu"):
        super().__init__(group, env, cfg, seed, device)
        # the agents this one learns for, itself first: itself alone, or its team's (join_team)
        self.learns_for: list[OffPolicyAgent] = [self]
        self.gradient_steps = 0
        self._owed = 0.0   # gradient steps owed to the episodes collected, not yet taken (the fraction)
        self.replay: EpisodeReplay | TransitionReplay | None = None   # made by make_storage; a team's lead reads it

    # ------------------------------------------------------------------ for the algorithms

    @classmethod
    def stores_state(cls, cfg) -> bool:
        """Whether ``loss`` reads the global state (so the replay keeps it)."""
        return False

    def trained_modules(self) -> list[nn.Module]:
        """The online networks the optimiser steps: the agents' it learns for, and its own."""
        raise NotImplementedError

    def make_replay(self, layout: StorageLayout) -> EpisodeReplay | TransitionReplay:
        """The family's replay of ``buffer_size`` (episodes or transitions)."""
        raise NotImplementedError

    def owed_steps(self, batch: ReplayBatch) -> float:
        """The gradient steps owed to what one rollout collected (``batch.new_episodes`` episodes
        ended, ``batch.env_steps`` env steps)."""
        raise NotImplementedError

    def loss(self, samples: list[dict[str, torch.Tensor]]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss on the same ``batch_size`` draws of each agent it learns for (``samples[i]``
        of ``learns_for[i]``, as the replay's ``take`` gives them, as tensors)."""
        raise NotImplementedError

    def learn(self, samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """One gradient step on ``samples`` (see ``loss``) -> its metrics: by default down ``loss``
        with the one optimiser."""
        loss, metrics = self.loss(samples)
        gradient_step(self.optimizer, self._clipped, loss, metrics, self.cfg.max_grad_norm, self.who)
        return metrics

    @property
    def who(self) -> str:
        """The group and its agent, for messages."""
        return f"group {self.group.name!r} ({self.registered_name})"

    def update_metrics(self, progress: Progress | None) -> dict[str, float]:
        """What an update logs beside the loss's metrics (an exploration rate)."""
        return {}

    def set_optimizer(self) -> None:
        """One Adam over ``trained_modules``, their gradients clipped together."""
        self._clipped = [p for m in self.trained_modules() for p in m.parameters()]
        self.optimizer = Adam([{"params": self._clipped, "lr": self.cfg.lr}])

    # ------------------------------------------------------------------ before anything starts

    @classmethod
    def schedule_of(cls, cfg: OffPolicyConfig) -> Schedule:
        return Schedule(learning_starts=cfg.learning_starts)

    # ------------------------------------------------------------------ learning

    def make_storage(self, layout: StorageLayout) -> EpisodeReplay | TransitionReplay:
        self.replay = self.make_replay(layout)
        return self.replay

    def update(self, batch: ReplayBatch, progress: Progress | None = None) -> dict[str, float]:
        cfg, replay = self.cfg, batch.replay
        held = f"replay_{self.replay_unit}"
        if not self.learns_for:   # its team's lead learns for it, on its replay
            return {}
        if len(replay) < cfg.batch_size:   # as EPyMARL: no steps owed to what came before the first batch
            return {held: float(len(replay))}
        self._owed += self.owed_steps(batch)
        steps, self._owed = int(self._owed), self._owed - int(self._owed)
        stop = progress.stop_requested if progress is not None and progress.stop_requested else bool

        def step(index: np.ndarray) -> dict:
            # the same draws of every group learned for: their replays fill alike, slot by slot
            samples = [{k: torch.from_numpy(v).to(self.device) for k, v in member.replay.take(index).items()}
                       for member in self.learns_for]
            metrics = self.learn(samples)
            self.gradient_steps += 1
            self.update_targets()
            return metrics

        done = self.gradient_steps
        metrics = gradient_steps((replay.sample_index(cfg.batch_size, self.rng) for _ in range(steps)), steps,
                                 step, stop)
        metrics.update(self.update_metrics(progress))
        metrics[held] = float(len(replay))
        metrics["gradient_steps"] = float(self.gradient_steps - done)
        return metrics

    @torch.no_grad()
    def update_targets(self) -> None:
        """After a gradient step: every ``target_update_interval`` steps a copy of the online
        networks, or with ``target_update_tau`` a step of that size towards them."""
        cfg = self.cfg
        if cfg.target_update_tau is None and self.gradient_steps % cfg.target_update_interval:
            return
        for modules in (member.modules for member in self.learns_for):
            for name in [k for k in modules if "target_" + k in modules]:
                if cfg.target_update_tau is None:
                    modules["target_" + name].load_state_dict(modules[name].state_dict())
                else:
                    for target, online in zip(modules["target_" + name].parameters(), modules[name].parameters()):
                        target.lerp_(online, cfg.target_update_tau)

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict:
        return {**super().state_dict(), "modules": self.modules.state_dict(), "optimizer": self.optimizer.state_dict(),
                "gradient_steps": self.gradient_steps, "owed": self._owed}

    def load_state_dict(self, state: dict, weights_only: bool = False) -> None:
        super().load_state_dict(state, weights_only)
        self.modules.load_state_dict(state["modules"])
        if not weights_only:
            self.optimizer.load_state_dict(state["optimizer"])
            self.gradient_steps, self._owed = state["gradient_steps"], state["owed"]

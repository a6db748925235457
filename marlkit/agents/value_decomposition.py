"""The value-decomposition family: Q-learning on the off-policy family's replay (IQL, VDN, QMIX).

Every agent of the group reads its own observation (and id) through one Q network, weights shared
(the ``q`` model: ``mlp`` by default, ``gru`` for a recurrent agent, ``cnn`` for images). Acting
is epsilon-greedy among the allowed actions (``action_mask``; a masked action is never picked, at
random or greedily), epsilon falling linearly with the env steps collected (``Progress``), greedy
in evaluation. The replay, the gradient steps owed to new episodes and the target networks are
``agents/off_policy.py``'s; each gradient step here is TD(lambda) on ``batch_size`` whole episodes
(``td_lambda``; 0: one-step) with double Q (the online network picks the next action, the target
network values it).

A time limit is a truncation: the step after an episode's last is valued (from the observation the
episode ended at); a termination is not. A mixer (VDN, QMIX) turns the agents' Q-values into the
team's, trained on the team reward (the agents' rewards summed, ``team_reward``); without one
(IQL) each agent learns its own Q on its own reward. Absent agents (``agent_mask`` False) are left
out of the mix and of the loss. A team of several groups (``EnvSpec.teams``) is mixed as one
(``join_team``).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import nn

from marlkit.agents.base import ActOut, Progress, require_discrete
from marlkit.agents.off_policy import OffPolicyAgent, OffPolicyConfig
from marlkit.agents.on_policy import known_model
from marlkit.agents.shared_actor import SharedActor
from marlkit.config import ModelConfig, RunnerConfig, value_range
from marlkit.errors import ConfigError
from marlkit.memory import MemoryEstimate
from marlkit.networks.normalization import RunningMeanStd
from marlkit.storage import EpisodeReplay, StorageLayout
from marlkit.storage.returns import lambda_returns


@dataclass
class ValueDecompositionConfig(OffPolicyConfig):
    """The off-policy family's settings and those IQL, VDN and QMIX share; the defaults are
    EPyMARL's, but for ``td_lambda``. ``batch_size`` and ``buffer_size`` count episodes."""

    gradient_steps_per_episode: float = field(default=1.0, metadata=value_range(0.0))
    epsilon_start: float = field(default=1.0, metadata=value_range(0.0, 1.0))
    epsilon_finish: float = field(default=0.05, metadata=value_range(0.0, 1.0))
    epsilon_anneal_steps: int = field(default=50_000, metadata=value_range(0))   # env steps
    double_q: bool = True
    # TD(lambda) targets over each replayed episode (pymarl2's 0.6), which carry a sparse reward back
    # through an episode in one update; 0: one-step targets (EPyMARL's). The one default changed
    # from EPyMARL's: on LBF, QMIX learned far more with it (docs/benchmarks.md)
    td_lambda: float = field(default=0.6, metadata=value_range(0.0, 1.0))
    use_agent_id: bool = True
    team_reward: Literal["sum", "mean"] = "sum"
    # rewards as (r - mean) / std of all rewards replayed so far (EPyMARL's standardise_rewards)
    standardise_rewards: bool = True
    q: ModelConfig = field(default_factory=ModelConfig)


class ValueDecompositionAgent(OffPolicyAgent):
    """Q networks, epsilon-greedy acting and the TD loss on an off-policy agent's replay; ``mixer``
    (None: IQL) is what the family's algorithms differ in."""

    config_cls = ValueDecompositionConfig
    checks_groups = True

    def __init__(self, group, env, cfg: ValueDecompositionConfig, seed=0, device="cpu"):
        self.check_group(group)
        super().__init__(group, env, cfg, seed, device)
        torch.manual_seed(self.seed)  # weight initialisation draws from the global generator
        self.actor = SharedActor(self.registered_name, group, env, cfg)
        encoder = self.actor.model("q", group.obs_shape, per_agent=True)
        head = nn.Linear(encoder.out_dim + self.actor.id_width_after(group.obs_shape), group.n_actions)
        online = {"q": encoder, "q_head": head}
        self.mixed_agents = self.n_agents   # the agents the mixer mixes: the team's, where groups learn as one
        mixer = self.build_mixer()
        if mixer is not None:
            online["mixer"] = mixer
        targets = {f"target_{k}": copy.deepcopy(m).requires_grad_(False) for k, m in online.items()}
        self.modules = nn.ModuleDict({**online, **targets, "reward_norm": RunningMeanStd()}).to(self.device)
        self.recurrent = encoder.is_recurrent
        self.set_optimizer()

    # ------------------------------------------------------------------ before anything starts

    @classmethod
    def check_group(cls, group) -> None:
        require_discrete(cls.registered_name, group)

    @classmethod
    def check_config(cls, cfg: ValueDecompositionConfig, rc: RunnerConfig, key: str) -> None:
        known_model(cfg.q.name, f"{key}.q.name")
        if "encoder" in cfg.q.kwargs:
            known_model(cfg.q.kwargs["encoder"], f"{key}.q.kwargs.encoder")
        if cfg.epsilon_finish > cfg.epsilon_start:
            raise ConfigError(f"{key}.epsilon_finish={cfg.epsilon_finish} is above {key}.epsilon_start="
                              f"{cfg.epsilon_start}; exploration falls from start to finish")

    @classmethod
    def memory_estimate(cls, layout: StorageLayout, cfg: ValueDecompositionConfig, key: str = "") -> MemoryEstimate:
        """The replay's episodes of ``env.episode_limit`` steps (``runner.horizon`` where the env does not
        tell) and the rollouts it is filled from; an update holds a batch of episodes as float32,
        with about three times as much again for activations and gradients."""
        stores = cls.stores_state(cfg)
        episode = EpisodeReplay.bytes_per_episode(layout, stores)
        steps = layout.env.episode_limit or layout.horizon
        rollouts = (2 if layout.double else 1) * layout.horizon * layout.num_envs * episode // (steps + 1)
        update = cfg.batch_size * episode * 4 * 4
        return MemoryEstimate(cfg.buffer_size * episode + rollouts, update,
                              (f"{key}.buffer_size", f"{key}.batch_size", "env.resize (for images)"))

    @classmethod
    def stores_state(cls, cfg) -> bool:
        return cls.mixes_on_state(cfg)

    def make_replay(self, layout: StorageLayout) -> EpisodeReplay:
        return EpisodeReplay(layout, self.cfg.buffer_size, self.stores_state(self.cfg))

    def owed_steps(self, batch) -> float:
        """``gradient_steps_per_episode`` for each episode the rollout completed (EPyMARL's episode
        runner: one)."""
        return batch.new_episodes * self.cfg.gradient_steps_per_episode

    @classmethod
    def mixes_on_state(cls, cfg) -> bool:
        """Whether the mixer reads the global state (so the replay keeps it)."""
        return False

    # ------------------------------------------------------------------ for the algorithms

    def build_mixer(self) -> nn.Module | None:
        """The team's mixer of ``self.mixed_agents`` agents' Q-values, or None: each agent learns its
        own Q (IQL)."""
        return None

    # ------------------------------------------------------------------ teams of several groups

    @classmethod
    def join_team(cls, members: dict[str, "ValueDecompositionAgent"]) -> None:
        """The agents of a team's groups learn as one: the first (the lead) holds one mixer over
        every agent of the team, whatever group's Q network it acts with, trains on the team's
        reward, and takes every gradient step for all of them, on the same replayed episodes of
        each group; the others learn nothing on their own. Without a mixer (IQL) each agent learns
        its own Q, and there is nothing to join."""
        lead, *rest = members.values()
        if lead.build_mixer() is None:
            return
        lead.mixed_agents = sum(m.n_agents for m in members.values())
        mixer = lead.build_mixer().to(lead.device)
        lead.modules["mixer"] = mixer
        lead.modules["target_mixer"] = copy.deepcopy(mixer).requires_grad_(False)
        for member in rest:
            del member.modules["mixer"], member.modules["target_mixer"]
            member.learns_for = []
        lead.learns_for = list(members.values())
        lead.set_optimizer()
        for member in rest:
            member.optimizer = lead.optimizer

    def trained_modules(self) -> list[nn.Module]:
        """The Q networks of the agents it learns for, and its mixer."""
        return [m.modules[k] for m in self.learns_for for k in ("q", "q_head")] + \
            ([self.modules["mixer"]] if "mixer" in self.modules else [])

    # ------------------------------------------------------------------ acting

    def initial_hidden(self, num_envs: int) -> np.ndarray | None:
        if not self.recurrent:
            return None
        return np.zeros((num_envs, self.n_agents, self.modules["q"].hidden_size), np.float32)

    def tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device)

    def q_values(self, prefix: str, obs: torch.Tensor, hidden, episode_start, present) -> tuple[torch.Tensor, object]:
        """Q ``[L, B, A, n]`` of observations ``[L, B, A, ...]`` from the online (``prefix`` "") or
        target (``"target_"``) network, and the next hidden state."""
        features, hidden = self.actor.encode(self.modules[prefix + "q"], obs, hidden, episode_start, present=present)
        return self.modules[prefix + "q_head"](features), hidden

    def epsilon(self, progress: Progress | None) -> float:
        """Falls linearly from ``epsilon_start`` to ``epsilon_finish`` over ``epsilon_anneal_steps``
        env steps; 0 outside training (``progress`` None: evaluation and ``--test`` play greedily)."""
        cfg = self.cfg
        if progress is None:
            return 0.0
        done = min(progress.steps / cfg.epsilon_anneal_steps, 1.0) if cfg.epsilon_anneal_steps else 1.0
        return cfg.epsilon_start + done * (cfg.epsilon_finish - cfg.epsilon_start)

    @torch.inference_mode()
    def act(self, obs, state, agent_mask, action_mask, hidden, explore: bool = True,
            progress: Progress | None = None) -> ActOut:
        """Greedy among the allowed actions, or (``explore``, with probability epsilon) one of them at
        random; every env draws the same amount of noise either way, from its own stream."""
        present = self.tensor(agent_mask).unsqueeze(0)
        h = self.tensor(hidden) if hidden is not None else None
        q, h = self.q_values("", self.tensor(obs).unsqueeze(0), h, None, present)
        allowed = action_mask.astype(bool)
        greedy = np.where(allowed, q[0].cpu().numpy(), -np.inf).argmax(-1)
        actions = greedy
        if explore and progress is not None:
            E, A = agent_mask.shape
            coin = self.streams.uniform((E, A))
            scores = np.where(allowed, self.streams.uniform(allowed.shape), -1.0)
            actions = np.where(coin < self.epsilon(progress), scores.argmax(-1), greedy)
        return ActOut(actions.astype(np.int64), np.zeros(agent_mask.shape, np.float32), None,
                      h.cpu().numpy() if h is not None else None)

    # ------------------------------------------------------------------ learning

    def update_metrics(self, progress: Progress | None) -> dict[str, float]:
        return {"epsilon": self.epsilon(progress)}

    def td_terms(self, sample: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This agent's group's part of a TD loss on ``batch_size`` replayed episodes
        (``EpisodeReplay.take``: ``[B, L (+ 1), ...]``), time-major: the Q-values of the actions taken
        ``taken`` and the target networks' values of the next step ``next_q`` ``[L, B, A]``, who is
        ``present`` ``[L + 1, B, A]`` and who ``acted`` ``[L, B, A]``, and the rewards and ends."""
        time_major = {k: v.transpose(0, 1) for k, v in sample.items() if v.dim() > 1}   # [L (+ 1), B, ...]
        obs, present = time_major["obs"], time_major["agent_mask"].bool()
        starts = torch.cat([torch.zeros_like(time_major["agent_end"][:1]), time_major["agent_end"]], 0).bool()
        q, _ = self.q_values("", obs, None, starts, None if self.recurrent else present)          # [L + 1, B, A, n]
        with torch.no_grad():
            target_q, _ = self.q_values("target_", obs, None, starts, None if self.recurrent else present)
            allowed = time_major["action_mask"].bool()
            if self.cfg.double_q:
                pick = q.detach().masked_fill(~allowed, -math.inf).argmax(-1, keepdim=True)
                next_q = target_q.gather(-1, pick).squeeze(-1)[1:]
            else:
                next_q = target_q.masked_fill(~allowed, -math.inf).max(-1).values[1:]
            next_q = torch.where(present[1:], next_q, 0.0)                                   # [L, B, A]
        filled = time_major["filled"].bool()                                               # [L, B]
        return {"taken": q[:-1].gather(-1, time_major["actions"].long().unsqueeze(-1)).squeeze(-1),
                "next_q": next_q, "present": present, "acted": filled.unsqueeze(-1) & present[:-1],
                "reward": time_major["reward"].float(), "terminated": time_major["terminated"].bool(),
                "truncated": time_major["truncated"].bool(), "filled": filled, "state": time_major.get("state"),
                "length": sample["length"]}

    def loss(self, samples: list[dict[str, torch.Tensor]]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The TD loss on the same ``batch_size`` episodes of each group this agent learns for
        (``samples[i]`` of ``learns_for[i]``): with a mixer, the team's Q of every agent of them
        against the team reward; without, each agent's own Q against its own reward."""
        cfg = self.cfg
        parts = [member.td_terms(sample) for member, sample in zip(self.learns_for, samples)]
        # the agents of every group side by side: [L (+ 1), B, A_team]
        taken, next_q, present, acted, reward, terminated, truncated = (
            torch.cat([p[k] for p in parts], -1) if len(parts) > 1 else parts[0][k]
            for k in ("taken", "next_q", "present", "acted", "reward", "terminated", "truncated"))
        filled, length, state = parts[0]["filled"], parts[0]["length"], parts[0]["state"]
        if "mixer" in self.modules:
            reward = reward.sum(-1) if cfg.team_reward == "sum" else reward.mean(-1)        # [L, B]
        if cfg.standardise_rewards:
            norm = self.modules["reward_norm"]
            norm.update(reward[filled] if "mixer" in self.modules else reward[acted])
            reward = norm.normalize(reward)
        if "mixer" not in self.modules:
            # each agent on its own: its termination ends its returns, a time limit's cut does not
            target = lambda_returns(reward, next_q, (~terminated).float(), acted[1:], cfg.gamma, cfg.td_lambda)
            mask = acted.float()
            td = torch.where(acted, taken - target, 0.0)
        else:
            team_q = self.modules["mixer"](taken, state[:-1], present[:-1])                 # [L, B]
            with torch.no_grad():
                next_team = self.modules["target_mixer"](next_q, state[1:], present[1:])
            last = torch.arange(len(filled), device=filled.device)[:, None] == (length - 1)[None]
            # the team's episode ends in a termination at its last step, unless a time limit cut it there
            # (what absent agents' slots hold does not count)
            cut, ended = (truncated & ~terminated & acted).any(-1), (terminated & acted).any(-1)
            ends = last & ended & ~cut
            mask = (filled & present[:-1].any(-1)).float()
            target = lambda_returns(reward, next_team, (~ends).float(), mask[1:].bool(), cfg.gamma, cfg.td_lambda)
            td = torch.where(mask.bool(), team_q - target, 0.0)
        loss = td.pow(2).sum() / mask.sum().clamp(min=1.0)
        return loss, {"td_loss": loss.detach(), "q_taken": taken.detach()[acted].mean()}

"""An off-policy actor-critic of your own in one file: a deterministic policy whose exploration noise
falls linearly over training (DDPG's is constant), on marlkit's off-policy actor-critic base, which
brings the replay of transitions, the critics (per agent or centralised), target networks, agent
masks, checkpoints and acting in env workers.

    python examples/custom_actor_critic.py --list
    python examples/custom_actor_critic.py --agent DECAY_DDPG --env mpe_spread_continuous --set runner.total_steps=50000
    marlkit --import custom_actor_critic --agent DECAY_DDPG --env mpe_spread_continuous   # examples/ on PYTHONPATH

Running this file is the ``marlkit`` command with the new agent registered: every CLI flag works.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from marlkit.agents.base import Progress
from marlkit.agents.off_policy_actor_critic import ActorCriticConfig, OffPolicyActorCritic
from marlkit.registry import register_agent


@dataclass
class DecayingNoiseConfig(ActorCriticConfig):
    initial_noise: float = field(default=0.3, metadata={"min": 0.0})   # in units of the Box's half-range
    final_noise: float = field(default=0.05, metadata={"min": 0.0})
    decay_steps: int = field(default=100_000, metadata={"min": 1})     # env steps


@register_agent("DECAY_DDPG")
class DecayingNoiseDDPG(OffPolicyActorCritic):
    """DDPG whose Gaussian exploration noise falls linearly with the env steps
    (``examples/custom_actor_critic.py``)."""

    config_cls = DecayingNoiseConfig

    def noise_std(self, progress: Progress | None) -> float:
        cfg = self.cfg
        done = min(progress.steps / cfg.decay_steps, 1.0) if progress is not None else 1.0
        return cfg.initial_noise + done * (cfg.final_noise - cfg.initial_noise)

    # the policy: one output per action dimension, tanh into [-1, 1]
    def policy_outputs(self) -> int:
        return self.action_size

    def policy_actions(self, out: torch.Tensor, explore: bool, noise):
        actions = torch.tanh(out)
        if explore:
            actions = (actions + self.std * noise.normal(actions.shape)).clamp(-1, 1)
        return actions, None

    # acting: the noise of where training stands (evaluation, progress None, acts without any)
    def act(self, obs, state, agent_mask, action_mask, hidden, explore=True, progress=None):
        self.std = self.noise_std(progress)
        return super().act(obs, state, agent_mask, action_mask, hidden, explore, progress)

    # the actor's loss: ascend the critic's Q of the policy's actions (DDPG's)
    def actor_loss_terms(self, q: torch.Tensor, log_prob) -> torch.Tensor:
        return -q

    def update_metrics(self, progress: Progress | None) -> dict[str, float]:
        return {"exploration_noise": self.noise_std(progress)}


if __name__ == "__main__":
    from marlkit.cli import main

    raise SystemExit(main())

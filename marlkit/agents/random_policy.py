"""A uniformly random policy over the allowed actions: a baseline, or an opponent group."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gymnasium import spaces

from marlkit.agents.base import ActOut, Agent
from marlkit.registry import register_agent
from marlkit.spec import hybrid_parts


@dataclass
class RandomConfig:
    pass


@register_agent("random")
class RandomAgent(Agent):
    config_cls = RandomConfig
    learns = False
    # An untrained policy (near-uniform logits, sampled by Gumbel-max) picks from a stream the very
    # actions that the argmax of this policy's uniforms picks from it: as the baseline, evaluated
    # from the seeds the policy is evaluated from, it would replay the policy's moves. Evaluation
    # streams are drawn this far from the seed given.
    STREAM_OFFSET = 1_000_003

    def own_generators(self, seed: int):
        return super().own_generators(seed + self.STREAM_OFFSET)

    def act(self, obs, state, agent_mask, action_mask, hidden, explore: bool = True, progress=None) -> ActOut:
        space, (E, A) = self.group.action_space, agent_mask.shape
        hybrid = hybrid_parts(space)
        if hybrid is not None:  # [continuous in [-1, 1] or the Box's bounds, branch choices] as floats
            box, branches = space.spaces
            parts = np.split(action_mask, np.cumsum(hybrid[1])[:-1], -1)
            choices = np.stack([np.where(m, self.streams.uniform(m.shape), -1.0).argmax(-1) for m in parts], -1)
            low, high = np.nan_to_num(box.low, neginf=-1.0), np.nan_to_num(box.high, posinf=1.0)
            continuous = low + (high - low) * self.streams.uniform((E, A) + box.shape)
            return ActOut(np.concatenate([continuous, choices], -1).astype(np.float32), np.zeros((E, A), np.float32))
        if isinstance(space, spaces.Discrete):
            # argmax of random scores over allowed actions = uniform among them
            scores = np.where(action_mask, self.streams.uniform(action_mask.shape), -1.0)
            actions = scores.argmax(-1)
        elif isinstance(space, spaces.MultiDiscrete):
            parts = np.split(action_mask, np.cumsum(space.nvec)[:-1], -1)
            actions = np.stack([np.where(m, self.streams.uniform(m.shape), -1.0).argmax(-1) for m in parts], -1)
        else:
            low, high = np.broadcast_to(space.low, space.shape), np.broadcast_to(space.high, space.shape)
            low, high = np.nan_to_num(low, neginf=-1.0), np.nan_to_num(high, posinf=1.0)
            actions = (low + (high - low) * self.streams.uniform((E, A) + space.shape)).astype(np.float32)
        log_prob = np.zeros((E, A), np.float32)
        return ActOut(actions.astype(np.int64) if not isinstance(space, spaces.Box) else actions, log_prob)

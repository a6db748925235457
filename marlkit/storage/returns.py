"""Returns: GAE over ``[T, E, A]`` rollouts with masks (whose returns are the TD(lambda) targets of
the values it is given), the TD(lambda) targets of whole replayed episodes, and the neutral
bootstrap of an agent absent after a rollout."""
from __future__ import annotations

import numpy as np
import torch


def last_present_value(value: np.ndarray, agent_mask: np.ndarray) -> np.ndarray:
    """``[E, A]``: each slot's value at its last present step of the rollout (0 if never present).
    The neutral bootstrap for an agent that is absent right after the rollout, e.g. between two of
    its decisions: nothing is known about its future, so assume it stays where it was."""
    T = value.shape[0]
    last_t = np.where(agent_mask.any(0), T - 1 - np.argmax(agent_mask[::-1], axis=0), -1)
    picked = np.take_along_axis(value, np.maximum(last_t, 0)[None], 0)[0]
    return np.where(last_t >= 0, picked, 0.0).astype(np.float32)


def compute_gae(reward: np.ndarray, value: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
                episode_end: np.ndarray, agent_mask: np.ndarray, truncation_value: np.ndarray,
                last_value: np.ndarray, gamma: float, lam: float,
                importance: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimation over ``[T, E, A]`` with masks.

    - termination: the successor is worth 0; truncation: it is worth ``truncation_value[t]``, the
      value of the final observation; either way the advantage does not flow across the cut;
    - masked slots (agent absent) get advantage 0 and are skipped: a present step takes its
      successor's value and advantage from the agent's next present step in the same episode, and
      the rewards of the absent steps in between (an agent acting every k-th step is paid when it
      next decides); an agent's episode may also end while it is absent (``terminated`` or
      ``truncated`` there, per-agent episodes), which cuts it as if the cut were at its last action;
    - ``last_value`` ``[E, A]`` bootstraps the step after the rollout;
    - ``importance`` ``[T, E, A]`` (None: 1 everywhere) weighs each step's TD error and the trace
      through it, V-trace's ``rho_t`` and ``c_t`` where both are ``min(clip, ratio)`` (the caller
      clips): a step the policy has since moved away from counts for less, as does what follows it.
    Time is counted in the agent's decisions: one ``gamma`` from a present step to the next.
    Returns (advantages, returns), both 0 where the agent is absent.
    """
    T = reward.shape[0]
    if agent_mask.all():
        return _gae_all_present(reward, value, terminated, truncated, episode_end, truncation_value, last_value,
                                gamma, lam, importance)
    advantages = np.zeros_like(reward, dtype=np.float32)
    next_value = last_value.astype(np.float32).copy()
    next_adv = np.zeros_like(next_value)
    pending = np.zeros_like(next_value)    # rewards of absent steps after t, owed to the last action
    for t in reversed(range(T)):
        present = agent_mask[t]
        env_end = episode_end[t][:, None] if episode_end.ndim == 2 else episode_end[t]
        ended = terminated[t] | truncated[t] | env_end
        successor = np.where(terminated[t], 0.0,
                             np.where(truncated[t], truncation_value[t], np.where(env_end, 0.0, next_value)))
        reward_t = reward[t] + np.where(ended, 0.0, pending)
        delta = reward_t + gamma * successor - value[t]
        adv = delta + gamma * lam * np.where(ended, 0.0, next_adv)
        if importance is not None:
            adv = importance[t] * adv
        advantages[t] = np.where(present, adv, 0.0)
        next_adv = np.where(present, adv, np.where(ended, 0.0, next_adv))
        next_value = np.where(present, value[t], np.where(ended, successor, next_value))
        pending = np.where(present, 0.0, reward_t)
    returns = np.where(agent_mask, advantages + value, 0.0).astype(np.float32)
    return advantages, returns


def _gae_all_present(reward, value, terminated, truncated, episode_end, truncation_value, last_value, gamma, lam,
                     importance):
    """``compute_gae`` where every slot is present at every step, bit for bit: the same operations
    on the same numbers, with everything but the advantage's recursion done for all steps at once
    (an update that refreshes its advantages per minibatch runs this some 64 times)."""
    env_end = episode_end[:, :, None] if episode_end.ndim == 2 else episode_end
    ended = terminated | truncated | env_end
    next_value = np.concatenate([value[1:], last_value.astype(np.float32)[None]])
    successor = np.where(terminated, 0.0, np.where(truncated, truncation_value, np.where(env_end, 0.0, next_value)))
    delta = reward + gamma * successor - value
    # the trace's factor per step, float32 as the scalar gamma * lam meets float32 advantages
    carry = np.where(ended, np.float32(0.0), np.float32(gamma * lam))
    advantages = np.zeros_like(reward, dtype=np.float32)
    next_adv = np.zeros_like(last_value, dtype=np.float32)
    for t in reversed(range(reward.shape[0])):
        adv = advantages[t]   # written in place: three array operations per step
        np.multiply(carry[t], next_adv, out=adv)
        adv += delta[t]
        if importance is not None:
            adv *= importance[t]
        next_adv = adv
    returns = (advantages + value).astype(np.float32)
    return advantages, returns


def lambda_returns(reward: torch.Tensor, next_value: torch.Tensor, continues: torch.Tensor, has_next: torch.Tensor,
                   gamma: float, lam: float) -> torch.Tensor:
    """Targets ``[L, B, ...]`` for the values taken along whole episodes: G_t = r_t + gamma c_t
    ((1 - lam) V_{t+1} + lam G_{t+1}), with V_{t+1} the target network's value of the next step
    (``next_value``), c_t 0 where step t ended the return, and V_{t+1} alone where step t + 1 was
    not taken (``has_next`` ``[L - 1, B, ...]`` False: the episode's end, an absent agent). With
    ``lam`` 0 it is the one-step target r_t + gamma c_t V_{t+1}."""
    if lam == 0.0:
        return reward + gamma * continues * next_value
    # G_t = own_t + carry_t G_{t+1}: a linear recurrence, two operations per step
    taken = torch.cat([has_next.to(reward.dtype), torch.zeros_like(reward[:1])])
    carry = gamma * continues * lam * taken
    own = reward + gamma * continues * next_value * (1.0 - lam * taken)
    targets = torch.empty_like(reward)
    after = torch.zeros_like(reward[0])
    for t in reversed(range(len(reward))):
        after = own[t] + carry[t] * after
        targets[t] = after
    return targets

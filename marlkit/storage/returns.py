"""Returns over ``[T, E, A]`` rollouts with masks: GAE, TD(lambda), and the neutral bootstrap of
an agent absent after the rollout."""
from __future__ import annotations

import numpy as np


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
                last_value: np.ndarray, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimation over ``[T, E, A]`` with masks.

    - termination: the successor is worth 0; truncation: it is worth ``truncation_value[t]``, the
      value of the final observation; either way the advantage does not flow across the cut;
    - masked slots (agent absent) get advantage 0 and are skipped: a present step takes its
      successor's value and advantage from the agent's next present step in the same episode, and
      the rewards of the absent steps in between (an agent acting every k-th step is paid when it
      next decides); an agent's episode may also end while it is absent (``terminated`` or
      ``truncated`` there, per-agent episodes), which cuts it as if the cut were at its last action;
    - ``last_value`` ``[E, A]`` bootstraps the step after the rollout.
    Time is counted in the agent's decisions: one ``gamma`` from a present step to the next.
    Returns (advantages, returns), both 0 where the agent is absent.
    """
    T = reward.shape[0]
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
        advantages[t] = np.where(present, adv, 0.0)
        next_adv = np.where(present, adv, np.where(ended, 0.0, next_adv))
        next_value = np.where(present, value[t], np.where(ended, successor, next_value))
        pending = np.where(present, 0.0, reward_t)
    returns = np.where(agent_mask, advantages + value, 0.0).astype(np.float32)
    return advantages, returns


def td_lambda_targets(reward, q_taken, terminated, truncated, episode_end, agent_mask, truncation_value,
                      last_value, gamma: float, lam: float) -> np.ndarray:
    """TD(lambda) targets ``[T, E, A]`` for Q(s_t, u_t): G_t = r_t + gamma ((1 - lambda) Q_{t+1} +
    lambda G_{t+1}), cut at terminations (successor 0) and truncations (successor
    ``truncation_value``), absent slots skipped (0 there). GAE's returns over the values
    ``q_taken`` are exactly this recursion (A_t + Q_t = G_t), so its mask handling is reused."""
    _, returns = compute_gae(reward, q_taken, terminated, truncated, episode_end, agent_mask, truncation_value,
                             last_value, gamma, lam)
    return returns

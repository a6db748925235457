"""Loss terms over ``[L, B, A]`` tensors, averaged over present agents only."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over present agents; ``where`` rather than a product, so NaN/inf in an absent slot
    cannot leak in."""
    return torch.where(mask.bool(), x, 0.0).sum() / mask.sum().clamp(min=1.0)


def ppo_policy_loss(log_prob, old_log_prob, advantages, clip: float, mask):
    ratio = torch.exp(log_prob - old_log_prob)
    surrogate = torch.min(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages)
    loss = -masked_mean(surrogate, mask)
    with torch.no_grad():
        approx_kl = masked_mean((ratio - 1) - torch.log(ratio), mask)
        clip_fraction = masked_mean(((ratio - 1).abs() > clip).float(), mask)
    return loss, {"approx_kl": approx_kl, "clip_fraction": clip_fraction}


def value_loss(value, old_value, target, mask, clip: float | None, huber_delta: float | None):
    """Critic regression on normalised targets, optionally clipped around the rollout's values."""

    def error(v):
        if huber_delta is not None:
            return F.huber_loss(v, target, reduction="none", delta=huber_delta)
        return 0.5 * (v - target).pow(2)

    loss = error(value)
    if clip is not None:
        clipped = old_value + (value - old_value).clamp(-clip, clip)
        loss = torch.max(loss, error(clipped))
    return masked_mean(loss, mask)

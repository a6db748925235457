from __future__ import annotations

import torch
from torch import nn


class ValueNorm(nn.Module):
    """Running mean/std of value targets with debiased exponential averages (as in the MAPPO paper),
    so the critic regresses on normalised returns whatever the reward scale."""

    def __init__(self, beta: float = 0.99999, epsilon: float = 1e-5):
        super().__init__()
        self.beta, self.epsilon = beta, epsilon
        self.register_buffer("mean", torch.zeros(()))
        self.register_buffer("mean_sq", torch.zeros(()))
        self.register_buffer("debias", torch.zeros(()))

    def stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        debias = self.debias.clamp(min=self.epsilon)
        mean = self.mean / debias
        var = (self.mean_sq / debias - mean.pow(2)).clamp(min=1e-2)
        return mean, var.sqrt()

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        if x.numel() == 0:
            return
        x = x.double()
        self.mean.mul_(self.beta).add_((1 - self.beta) * x.mean().float())
        self.mean_sq.mul_(self.beta).add_((1 - self.beta) * x.pow(2).mean().float())
        self.debias.mul_(self.beta).add_(1 - self.beta)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        mean, std = self.stats()
        return (x - mean) / std

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        mean, std = self.stats()
        return x * std + mean


class RunningMeanStd(nn.Module):
    """Mean and variance of everything seen so far (Chan et al.'s parallel update), as EPyMARL
    standardises rewards with; buffers, so that checkpoints carry them."""

    def __init__(self, epsilon: float = 1e-4):
        super().__init__()
        self.register_buffer("mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("var", torch.ones((), dtype=torch.float64))
        self.register_buffer("count", torch.tensor(epsilon, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        if x.numel() < 2:
            return
        x = x.double()
        n, mean, var = x.numel(), x.mean(), x.var()
        delta, total = mean - self.mean, self.count + n
        m2 = self.var * self.count + var * n + delta.pow(2) * self.count * n / total
        self.mean.add_(delta * n / total)
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean) / self.var.clamp(min=1e-8).sqrt()).to(x.dtype)

"""Adam and gradient-norm clipping, each a few calls of PyTorch's fused kernels.

``torch.optim.Adam`` wraps its methods to keep PyTorch's compiler out of them, and so imports the
compiler package (``torch._dynamo``, a second of CPU) when the first optimiser is built; with
``clip_grad_norm_`` it also spends about twice the time of these per gradient step, a share a
small policy notices. marlkit
compiles nothing, so its agents step with these instead. They call the same kernels, in the same
order and with the same arguments, as ``torch.optim.Adam(..., fused=True)`` and
``torch.nn.utils.clip_grad_norm_`` do on CPU tensors, so they give the same bits
(``tests/test_optim.py`` compares them), and ``state_dict`` has torch's layout: checkpoints load
either way.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from marlkit.errors import TrainingDivergedError

DEFAULTS = {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0, "amsgrad": False, "maximize": False,
            "foreach": None, "capturable": False, "differentiable": False, "fused": True,
            "decoupled_weight_decay": False}


class Adam:
    """Adam (no weight decay, no AMSGrad) over ``param_groups``: dicts of ``params`` and ``lr``, and
    optionally ``eps`` and ``betas``; ``param_groups[i]["lr"]`` may be changed between steps."""

    UNSUPPORTED = ("weight_decay", "amsgrad", "maximize")

    def __init__(self, param_groups: Iterable[dict], eps: float = 1e-8, betas: tuple[float, float] = (0.9, 0.999)):
        self.param_groups = [{**DEFAULTS, "eps": eps, "betas": tuple(betas), **group, "params": list(group["params"])}
                             for group in param_groups]
        for i, group in enumerate(self.param_groups):
            for key in self.UNSUPPORTED:
                if group[key] != DEFAULTS[key]:
                    raise ValueError(f"parameter group {i}: {key}={group[key]!r} is not supported by marlkit's Adam "
                                     f"(it steps without it); leave {key} out, or set the agent's optimizer to a "
                                     "torch.optim one after OnPolicyAgent.__init__")
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    def zero_grad(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            states = [self.state[p] if p in self.state else self._new_state(p) for p in params]
            steps = [s["step"] for s in states]
            torch._foreach_add_(steps, 1)
            beta1, beta2 = group["betas"]
            torch._fused_adam_(params, [p.grad for p in params], [s["exp_avg"] for s in states],
                               [s["exp_avg_sq"] for s in states], [], steps, amsgrad=False, lr=group["lr"],
                               beta1=beta1, beta2=beta2, weight_decay=0.0, eps=group["eps"], maximize=False)

    def _new_state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        state = self.state[p] = {"step": torch.zeros((), dtype=torch.float32, device=p.device),
                                 "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                 "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
        return state

    def state_dict(self) -> dict:
        """torch's layout: parameters numbered in order across the groups."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            numbers = [index.setdefault(id(p), len(index)) for p in group["params"]]
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": numbers})
        return {"state": {index[id(p)]: dict(s) for p, s in self.state.items()}, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        saved = state_dict["param_groups"]
        if [len(g["params"]) for g in saved] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError("the optimiser state has parameter groups of sizes "
                             f"{[len(g['params']) for g in saved]}, this optimiser "
                             f"{[len(g['params']) for g in self.param_groups]}")
        params = {n: p for old, group in zip(saved, self.param_groups) for n, p in zip(old["params"], group["params"])}
        self.state = {}
        for n, s in state_dict["state"].items():
            p = params[n]
            self.state[p] = {k: v.to(device=p.device, dtype=torch.float32 if k == "step" else p.dtype, copy=True)
                             for k, v in s.items()}
        for old, group in zip(saved, self.param_groups):
            group.update({k: v for k, v in old.items() if k != "params"})


@torch.no_grad()
def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale the gradients of ``params`` in place so that their joint 2-norm is at most ``max_norm``;
    -> that norm before scaling."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
    torch._foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0))
    return total


def gradient_step(optimizer: Adam, params: list[torch.Tensor], loss: torch.Tensor, metrics: dict,
                  max_grad_norm: float | None, who: str) -> None:
    """One step of ``optimizer`` down ``loss``, the gradients of ``params`` clipped to ``max_grad_norm``
    (None: not) and their norm added to ``metrics``. A loss or a gradient norm that is not finite
    stops training with :class:`TrainingDivergedError` naming ``who`` (the group and its agent) and
    the loss's terms (``metrics``), before any weight is touched."""
    if not torch.isfinite(loss):
        terms = ", ".join(f"{k}={float(v):.4g}" for k, v in metrics.items())
        raise TrainingDivergedError(f"{who}: the loss became {loss.item()} ({terms}); lower the learning rate or "
                                    "check the env's rewards/observations for NaN or inf")
    optimizer.zero_grad()
    loss.backward()
    if max_grad_norm is not None:
        norm = clip_grad_norm(params, max_grad_norm)
        if not math.isfinite(float(norm)):
            raise TrainingDivergedError(f"{who}: the gradient norm became {float(norm)}")
        metrics["grad_norm"] = norm
    optimizer.step()


def gradient_steps(batches: Iterable, planned: int, step: Callable[[Any], dict], stop: Callable[[], bool]) -> dict:
    """``step(batch)`` (one gradient step, -> its metrics) on each of ``batches``, ``planned`` of
    them, until ``stop()`` (a user's Ctrl+C or SIGTERM, asked between steps: a long update ends at a
    step's boundary) -> the metrics averaged over the steps taken, and ``update_fraction`` (the
    share taken) where a stop cut them short. Both families' updates are this loop."""
    totals: dict[str, float] = {}
    counts: dict[str, int] = {}   # a metric is averaged over the steps that gave it (an actor's delayed steps)
    taken, batches = 0, iter(batches)
    while not stop():   # asked before the next batch is drawn: a stop draws nothing it will not use
        batch = next(batches, None)
        if batch is None:
            break
        for k, v in step(batch).items():
            totals[k] = totals.get(k, 0.0) + float(v)
            counts[k] = counts.get(k, 0) + 1
        taken += 1
    metrics = {k: v / counts[k] for k, v in totals.items()}
    if taken < planned:
        metrics["update_fraction"] = taken / planned
    return metrics

"""The precision of an update's forward passes (an agent's ``precision``): float32, or bfloat16
under torch's autocast with float32 weights, gradients and optimiser state. bfloat16 pays where the
device computes it natively; a CPU without AVX512-BF16 or AMX emulates it, many times slower than
float32 (docs/benchmarks.md, "The update in bfloat16")."""
from __future__ import annotations

import contextlib
import logging
import os
from functools import lru_cache

import torch

log = logging.getLogger(__name__)


def loss_precision(device: torch.device, precision: str):
    """The context a loss's forward passes run in: ``float32`` as built, or ``bfloat16``, where
    torch's autocast runs the convolutions and matmuls in bfloat16 while weights, gradients, Adam's
    moments and the action distributions (``ActionHead``) stay float32. On a CPU with bfloat16
    instructions (AVX512-BF16 or AMX) a convolutional update runs faster; where it has none, oneDNN
    emulates them, many times slower than float32 (docs/benchmarks.md)."""
    if precision != "bfloat16":
        return contextlib.nullcontext()
    if device.type == "cpu":
        warn_without_bfloat16()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def update_precision(precision: str, device: torch.device) -> str:
    """``precision`` as an update on ``device`` runs it: ``auto`` is bfloat16 on a CPU that computes
    it natively (AVX512-BF16 or AMX), else float32, GPUs included: there marlkit's small networks
    are bound by kernel launches, not arithmetic, and autocast's casts add launches (on an H200 the
    bfloat16 update of battle-CNN and doom_coop was slower than float32's at every rollout size,
    docs/benchmarks.md)."""
    if precision != "auto":
        return precision
    return "bfloat16" if device.type == "cpu" and cpu_has_bfloat16() else "float32"


# oneDNN's instruction sets below AVX512_CORE_BF16, to which ONEDNN_MAX_CPU_ISA can hold it
_ISAS_WITHOUT_BFLOAT16 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}


def cpu_has_bfloat16() -> bool:
    """Whether this CPU has bfloat16 instructions (AVX512-BF16 or AMX) and oneDNN may use them.
    oneDNN's own check (``_is_mkldnn_bf16_supported``) only asks for AVX-512, on which it emulates
    bfloat16: a Skylake or Cascade Lake Xeon passes it."""
    capabilities = torch.cpu.get_capabilities()
    native = capabilities.get("avx512_bf16") or capabilities.get("amx_bf16")
    held_to = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").upper()
    return bool(native) and held_to not in _ISAS_WITHOUT_BFLOAT16 and \
        bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@lru_cache(maxsize=None)
def warn_without_bfloat16() -> None:
    """Once per process: the warning where this CPU emulates bfloat16."""
    if not cpu_has_bfloat16():
        log.warning("precision: bfloat16 on a CPU without bfloat16 instructions (AVX512-BF16 or AMX): its "
                    "bfloat16 convolutions and matmuls are emulated, slower than float32; set the agent's "
                    "precision to float32 on this machine")

"""Keep freed memory for reuse instead of handing it back to the OS after every update.

glibc serves every allocation above its mmap threshold (32 MB at most) with a fresh ``mmap`` and
returns it with ``munmap`` when freed, so each large activation of an update (a CNN over a
rollout's images: hundreds of MB) is faulted in page by page, again in every minibatch. Measured on
MAgent2 battle 12v12 with ``cnn`` actor and critic, 2,000 env steps on a 2-core VM: 9.1 million
minor page faults and 21 of 97 s in the kernel; with the heap kept, 0.14 million and 0.5 s. Peak
RSS grows a little (605 -> 646 MB there): freed blocks stay mapped, and are reused.
"""
from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
TRIM_THRESHOLD = 2 ** 30   # free heap kept at the top before any is returned to the OS (an int)


def keep_freed_memory() -> bool:
    """Serve large allocations from the heap and keep freed heap memory (glibc's ``mallopt``);
    returns False where the C library is not glibc, which is then left as it is."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))

"""Keep freed memory for reuse instead of handing it back to the OS after every update.

glibc serves every allocation above its mmap threshold (32 MB at most) with a fresh ``mmap`` and
returns it with ``munmap`` when freed, so each large activation of an update (a CNN over a
rollout's images: hundreds of MB) is faulted in page by page, again in every minibatch. Measured on
MAgent2 battle 12v12 with ``cnn`` actor and critic, 2,000 env steps on a 2-core VM: 9.1 million
minor page faults and 21 of 97 s in the kernel; with the heap kept, 0.14 million and 0.5 s. Peak
RSS grows a little (605 -> 646 MB there): freed blocks stay mapped, and are reused.

Those settings hold for glibc's main arena. A second thread (the learner beside collection,
``runner.overlap``) gets an arena of its own, whose heaps are mapped and unmapped whole as they fill
and empty, and whose allocations larger than a heap (64 MB) are always mapped: the same churn again
(on battle with a CNN a third of the run went to page faults in the kernel, and overlap was slower
than without it, docs/benchmarks.md). One arena for the whole process keeps every thread's memory the main
arena's way. glibc fixes the number of arenas when a thread first allocates beside the main one,
so this is done before any other thread runs: by the marlkit program and ``marlkit.run`` first
thing, and by the runner again for other callers.
"""
from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8
TRIM_THRESHOLD = 2 ** 30   # free heap kept at the top before any is returned to the OS (an int)


def keep_freed_memory() -> bool:
    """Serve large allocations from the heap, keep freed heap memory, and one arena for every
    thread (glibc's ``mallopt``); returns False where the C library is not glibc, which is then left
    as it is."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return all([mallopt(M_ARENA_MAX, 1), mallopt(M_MMAP_MAX, 0), mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)])

"""The runner keeps freed memory for reuse: the large activations of an update, allocated and freed
in every minibatch, are not faulted in from the OS each time."""
import subprocess
import sys

import pytest

CODE = """
import resource, sys, threading
from marlkit.allocator import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
import torch
images = torch.randn(4800, 5, 13, 13)      # a rollout of 13x13x5 views: 74 MB of first-layer activations
conv = torch.nn.Conv2d(5, 32, 3)
def step():
    conv(images).relu().sum().backward()
def passes(n):
    for _ in range(n):
        step()
def run(n):                                 # in a thread of its own, as the update beside collection runs
    worker = threading.Thread(target=passes, args=(n,)) if sys.argv[2] == "thread" else None
    if worker is None:
        return passes(n)
    worker.start()
    worker.join()
run(3)                                      # the first passes map what they need
start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
run(5)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
"""


def faults(mode: str, where: str = "main") -> int:
    out = subprocess.run([sys.executable, "-c", CODE, mode, where], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_memory_is_reused_instead_of_faulted_in_again():
    default, kept = faults("default"), faults("keep")
    assert default > 5 * 18_000                 # each pass maps its activations afresh (74 MB = 18k pages)
    assert kept < default / 4, (kept, default)  # at most a pass or two grows the heap once more


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_thread_beside_the_main_one_reuses_its_freed_memory_too():
    """The update beside collection runs in a thread of its own, which glibc would give an arena of
    its own that maps and unmaps its heaps as they fill and empty (and maps every allocation larger
    than a heap): with one arena, a thread's passes reuse what the first ones mapped."""
    default, kept = faults("default", "thread"), faults("keep", "thread")
    assert default > 5 * 18_000, default
    assert kept < default / 4, (kept, default)

"""The runner keeps freed memory for reuse: the large activations of an update, allocated and freed
in every minibatch, are not faulted in from the OS each time."""
import subprocess
import sys

import pytest

CODE = """
import resource, sys
import torch
from marlkit.allocator import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
images = torch.randn(4800, 5, 13, 13)      # a rollout of 13x13x5 views: 74 MB of first-layer activations
conv = torch.nn.Conv2d(5, 32, 3)
def step():
    conv(images).relu().sum().backward()
for _ in range(3):                          # the first passes map what they need
    step()
start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
"""


def faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", CODE, mode], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_memory_is_reused_instead_of_faulted_in_again():
    default, kept = faults("default"), faults("keep")
    assert default > 5 * 18_000                 # each pass maps its activations afresh (74 MB = 18k pages)
    assert kept < default / 4, (kept, default)  # at most a pass or two grows the heap once more

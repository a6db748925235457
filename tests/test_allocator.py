"""The runner keeps freed memory for reuse: large buffers allocated and freed over and over (an
update's activations) are not faulted in from the OS each time."""
import subprocess
import sys

import pytest

CODE = """
import resource, sys
import numpy as np
from marlkit.allocator import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    block = np.ones(100 * 2**20, np.uint8)   # 100 MB, every page written
    del block
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
"""
PAGES = 100 * 2 ** 20 // 4096


def faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", CODE, mode], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_memory_is_reused_instead_of_faulted_in_again():
    assert faults("default") > 5 * PAGES        # each 100 MB block is a fresh mmap, faulted in page by page
    assert faults("keep") < 2 * PAGES           # faulted in once, then reused

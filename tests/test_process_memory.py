"""`return_freed_memory_to_the_os`: with glibc's mmap threshold fixed, a MiB-sized tensor gets a mapping of its own
(returned at free) even after a large block was freed, which by default raises the threshold above it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = """
import ctypes, sys, torch
from rlvr_lightning.runtime.process_memory import return_freed_memory_to_the_os

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
applied = return_freed_memory_to_the_os()
big = torch.empty(16 << 20, dtype=torch.uint8); big.fill_(1); del big  # freeing it raises glibc's threshold
before = libc.mallinfo2().hblkhd
tensor = torch.empty(1 << 20, dtype=torch.uint8)
print(applied, libc.mallinfo2().hblkhd - before >= 1 << 20)
"""


def _run(**env) -> str:
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    if "RLVR_MALLOC" not in env:
        environment.pop("RLVR_MALLOC", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=environment, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_mib_tensor_gets_its_own_mapping_after_a_large_block_was_freed():
    try:
        import ctypes

        ctypes.CDLL(None).mallinfo2  # noqa: B018
    except AttributeError:
        pytest.skip("glibc < 2.33 (no mallinfo2)")
    assert _run() == ["True", "True"]
    assert _run(RLVR_MALLOC="glibc") == ["False", "False"]  # glibc's default: the heap serves it

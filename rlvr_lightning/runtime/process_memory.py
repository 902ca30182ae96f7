"""Freed tensor memory goes back to the operating system: glibc's `malloc` otherwise keeps it.

glibc serves allocations above `M_MMAP_THRESHOLD` with their own `mmap`, returned at `free`, and the rest from
its heap, which it rarely shrinks. The threshold starts at 128 KiB but rises (up to 32 MiB) each time a large
block is freed, so after the first training step most activations (a few MiB each) come from the heap; what they
leave free there is still resident. Fixing the threshold keeps every tensor of 128 KiB or more in its own
mapping: on SmolLM2-135M (`scripts/bench_step.py`, the `heap` leg is the default glibc) the peak resident memory
of a step falls by 0.49 GB of 3.55 GB, for 7% more step time (the kernel zeroes each new mapping's pages;
docs/benchmarks.md). `rlvr` applies it at start; `RLVR_MALLOC=glibc` leaves glibc's default. Elsewhere than
glibc (macOS, musl) nothing is changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's initial value, kept fixed


def return_freed_memory_to_the_os() -> bool:
    """Fix glibc's mmap threshold (see the module docstring); whether it was set."""
    if os.environ.get("RLVR_MALLOC") == "glibc" or not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1

"""How `rlvr`'s process allocates host memory: `RLVR_MALLOC`, glibc's own settings (the default) or `release`.

glibc serves allocations above `M_MMAP_THRESHOLD` with their own `mmap`, returned at `free`, and the rest from
its heap, which it rarely shrinks. The threshold starts at 128 KiB but rises (up to 32 MiB) each time a large
block is freed, so after the first training step most activations (a few MiB each) come from the heap and are
reused from there; what they leave free stays resident. `release` fixes the threshold, keeping every tensor of
128 KiB or more in its own mapping, which `free` returns to the OS: on SmolLM2-135M (`scripts/bench_step.py
--case smollm2 --legs ours release`) the peak resident memory of a step falls by about 0.5 GB of 3.5 GB, and the
step takes about 1.2x as long (the kernel maps and zeroes each new tensor's pages; docs/benchmarks.md). On a CPU
time is the scarcer resource at these sizes, so glibc's settings are the default. Elsewhere than glibc (macOS,
musl) nothing is changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's initial value, kept fixed
MALLOC_CHOICES = {
    "glibc": "glibc's own settings, the fastest (the default)",
    "release": "freed tensor memory returned to the OS: less resident memory, a slower step",
}


def malloc_choice() -> str:
    """`RLVR_MALLOC` (default `glibc`), checked against `MALLOC_CHOICES`."""
    value = os.environ.get("RLVR_MALLOC", "glibc")
    if value not in MALLOC_CHOICES:
        choices = "; ".join(f"{name!r}: {what}" for name, what in MALLOC_CHOICES.items())
        raise ValueError(f"RLVR_MALLOC={value!r} is not valid; choose one of {choices}")
    return value


def apply_malloc_choice() -> bool:
    """`RLVR_MALLOC=release`: fix glibc's mmap threshold (`return_freed_memory_to_the_os`); whether it was set."""
    return malloc_choice() == "release" and return_freed_memory_to_the_os()


def return_freed_memory_to_the_os() -> bool:
    """Fix glibc's mmap threshold (see the module docstring); whether it was set (False elsewhere than glibc)."""
    if not sys.platform.startswith("linux"):
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

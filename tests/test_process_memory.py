"""`RLVR_MALLOC=release` (`apply_malloc_choice`): with glibc's mmap threshold fixed, a MiB-sized tensor gets a
mapping of its own (returned at free) even after a large block was freed, which by default (glibc's settings, the
default choice) raises the threshold above it; a value that is not a choice is refused by name."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = """
import ctypes, sys, torch
from rlvr_lightning.runtime.process_memory import apply_malloc_choice

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
applied = apply_malloc_choice()
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
    assert _run(RLVR_MALLOC="release") == ["True", "True"]
    assert _run() == ["False", "False"]  # glibc's settings, the default: the heap serves it
    assert _run(RLVR_MALLOC="glibc") == ["False", "False"]


def test_rlvr_refuses_an_allocator_choice_it_does_not_know(monkeypatch, capsys):
    from rlvr_lightning.cli import entry_point

    monkeypatch.setenv("RLVR_MALLOC", "jemalloc")
    assert entry_point(["fit", "--config", "never-read.yaml"]) == 2
    err = capsys.readouterr().err
    assert "RLVR_MALLOC='jemalloc' is not valid" in err and "'glibc'" in err and "'release'" in err

"""Clock reads for timers around device work.

CUDA kernels run asynchronously: a clock read right after queuing them measures the queuing, and the
work lands in whichever timer reads the clock after the next synchronisation. `clock(device)` first waits
for the work this thread queued on `device`, i.e. its current stream: a sampler on a side stream in a
background thread then does not wait for the update's kernels, nor the update for the sampler's
(`torch.cuda.synchronize` would wait for every stream of the device).
"""

from __future__ import annotations

import time

import torch


def synchronize(device: torch.device | str | None) -> None:
    """Wait until the work this thread queued on `device` (its current stream) has run; nothing on a CPU."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.current_stream(torch.device(device)).synchronize()


def clock(device: torch.device | str | None = None) -> float:
    """`time.perf_counter()` once the work queued on `device` by this thread has run."""
    synchronize(device)
    return time.perf_counter()


def elapsed_seconds(started: float, device: torch.device | str | None = None) -> float:
    """Seconds since `started` (a `clock` or `time.perf_counter` reading), the device's queued work included."""
    return clock(device) - started

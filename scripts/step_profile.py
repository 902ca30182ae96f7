"""Where one training step of a `bench_step.py` leg spends its time, from `torch.profiler` (`BENCH_PROFILE=1`).

Each leg then runs one step more than it measures and records that one (the measured steps stay unprofiled). Its
report goes to the leg's standard error (the benchmark's log): per timed section (`StepTimer`'s, marked with
`record_function`), the host time, the device time and the operators launched during it; then the step's operators
by their own device time (by host time on a CPU). On a GPU a section whose host time is far above its device time
is bound by launching its work, not by the work.

    BENCH_PROFILE=1 python scripts/bench_step.py --case smollm2_long --device cuda --gpu-precision --steps 2
"""

from __future__ import annotations

import os
import sys

import torch
from torch.autograd import DeviceType

SECTION_MARK = "## "  # the prefix of a section's `record_function` label


def profiling() -> bool:
    return os.environ.get("BENCH_PROFILE", "") not in ("", "0")


def start(device: str) -> torch.profiler.profile:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if str(device).startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(activities=activities)
    profiler.start()
    return profiler


def report(profiler: torch.profiler.profile, device: str, label: str, rows: int = 20) -> str:
    """The sections' totals, then the step's `rows` costliest operators. A section's device time and operators are
    those that started inside its time span, on any thread (autograd runs a GPU's backward in a thread of its own);
    the sections end on `clock`, which waits for their queued work."""
    events = profiler.events()
    # on a GPU the sections' own labels are mirrored as device ranges that span their kernels: not counted as work
    kernels = [e for e in events if e.device_type != DeviceType.CPU and not e.name.startswith(SECTION_MARK)]
    operators = [e for e in events if e.device_type == DeviceType.CPU and e.name.startswith("aten::")]
    lines = [f"# profile of one step, {label} ({device})", "section          host ms  device ms  operators"]
    totals: dict[str, list[float]] = {}
    for event in events:
        if not event.name.startswith(SECTION_MARK):
            continue
        begin, end = event.time_range.start, event.time_range.end
        total = totals.setdefault(event.name[len(SECTION_MARK) :], [0.0, 0.0, 0])
        total[0] += event.cpu_time_total / 1e3
        total[1] += sum(k.time_range.elapsed_us() for k in kernels if begin <= k.time_range.start <= end) / 1e3
        total[2] += sum(begin <= o.time_range.start <= end for o in operators)
    for name, (host, device_ms, count) in totals.items():
        lines.append(f"{name:<16} {host:>7.1f}  {device_ms:>9.1f}  {count:>9d}")
    sort = "self_device_time_total" if str(device).startswith("cuda") else "self_cpu_time_total"
    lines.append(profiler.key_averages().table(sort_by=sort, row_limit=rows))
    return "\n".join(lines)


def finish(profiler: torch.profiler.profile, device: str, label: str) -> None:
    profiler.stop()
    print(report(profiler, device, label), file=sys.stderr, flush=True)

"""What a benchmark does with a variant that raises (a compiler error, out of memory): one line that names it,
printed at once, and the device's cache freed so that the variants after it still run."""

from __future__ import annotations

import torch


def reported_failure(label: str, error: Exception, device: torch.device, width: int = 300) -> str:
    """`error` in one line (type and first line of its message), printed as `# {label} failed: ...`; returned."""
    line = f"{type(error).__name__}: {error}".splitlines()[0][:width]
    print(f"# {label} failed: {line}", flush=True)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return line

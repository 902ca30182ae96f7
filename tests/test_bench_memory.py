"""scripts/bench_memory.py on a tiny model: FSDP2 on 2 ranks holds at most 0.6x of DDP's parameters + optimizer
state per rank (half, up to shard padding), and the same activations (FSDP does not shard them)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_fsdp2_halves_parameter_and_optimizer_memory_per_rank():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for name in ("MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK"):  # launch a fresh job, not join one
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_memory.py"), "--model", "tiny", "--steps", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {}
    for line in result.stdout.splitlines():
        fields = line.split()
        if fields and fields[0] in ("ddp", "fsdp2"):
            rows[(fields[0], int(fields[1]))] = [float(x) for x in fields[2:8]]
    assert sorted(rows) == [("ddp", 0), ("ddp", 1), ("fsdp2", 0), ("fsdp2", 1)]
    for rank in (0, 1):
        ddp, fsdp = rows[("ddp", rank)], rows[("fsdp2", rank)]
        params, grads, optim, total, activations = 0, 1, 2, 3, 4
        assert fsdp[total] <= 0.6 * ddp[total]
        assert abs(fsdp[params] - ddp[params] / 2) < 0.1 and abs(fsdp[optim] - ddp[optim] / 2) < 0.2
        assert ddp[grads] == ddp[params] and fsdp[grads] == fsdp[params]
        assert fsdp[activations] == ddp[activations] > 0
    ratio = float(re.search(r"FSDP2 / DDP \(largest rank\): ([0-9.]+)", result.stdout).group(1))
    assert 0.45 < ratio <= 0.6

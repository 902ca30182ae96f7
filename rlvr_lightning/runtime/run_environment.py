"""What a run was measured with: package versions, threads, machine, git commit and date, as JSON.

`environment_record()` is written as `environment.json` beside every `rlvr fit` run's logs
(`callbacks/environment.py`) and beside every figure `scripts/learning_suite.py` checks, so a
published number can be traced to the software and machine that produced it. Nothing here
imports Lightning or the packages it reports on (versions come from the installed distributions'
metadata), except torch, whose build and thread count are only known to torch itself.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

import torch

# Read when torch and MKL load, so set in the environment of a fresh process: ATen's vectorised kernels pinned to
# AVX2 (the same instructions on Intel and AMD), MKL's BLAS to its COMPATIBLE branch (conditional numerical
# reproducibility: MKL_CBWR=AVX2 holds on Intel CPUs only, an AMD CPU then takes its own branch), oneDNN capped.
# Kernels of another instruction set round the last bits differently, which a few rollout steps turn into another
# trajectory; pinned, every x86-64 machine with AVX2 of one vendor computes the same numbers (an AMD EPYC and an
# Intel Xeon agree on a first forward pass, not on the last bits of an update: tests/golden keeps one per vendor).
PINNED_CPU_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2"}

# distribution name (as pip knows it) -> key in the record
PACKAGES = {
    "transformers": "transformers",
    "lightning": "lightning",
    "peft": "peft",
    "numpy": "numpy",
    "math-verify": "math_verify",
    "jsonargparse": "jsonargparse",
    "trl": "trl",
    "vllm": "vllm",
}
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
REPO = Path(__file__).resolve().parents[1]


def package_version(distribution: str) -> str | None:
    """The installed version of a distribution, or None when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_build() -> dict:
    """torch's version, what it was built for ("cpu", "cuda 12.8" or "rocm 6.4") and the CPU kernels it dispatches to
    ("AVX512", "AVX2", ...: other kernels round differently, so a run's trajectory differs with them)."""
    cuda, hip = torch.version.cuda, getattr(torch.version, "hip", None)
    build = f"cuda {cuda}" if cuda else f"rocm {hip}" if hip else "cpu"
    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    )
    cpu_capability = torch.backends.cpu.get_cpu_capability()
    return {"version": torch.__version__, "build": build, "gpus": gpus, "cpu_capability": cpu_capability}


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name from /proc/cpuinfo (x86: "model name"; some ARM kernels: "Hardware"), else platform's."""
    try:
        lines = cpuinfo.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    for key in ("model name", "Hardware", "cpu model", "Processor"):
        for line in lines:
            name, _, value = line.partition(":")
            if name.strip() == key and value.strip():
                return value.strip()
    return platform.processor() or platform.machine()


def total_memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024  # the kernel reports kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def git_state(repo: Path) -> dict:
    """{"commit": HEAD's hash or None, "dirty": uncommitted changes to tracked files (None without git)}."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):  # no git on this machine
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def environment_record(repo: str | Path | None = None) -> dict:
    """A JSON-able record of the software, threads and machine of this process (`repo`: whose git commit to record;
    default this package's checkout)."""
    repo = Path(repo) if repo is not None else REPO
    memory = total_memory_bytes()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch_build(),
        "packages": {key: package_version(name) for name, key in PACKAGES.items()},
        "threads": {
            "torch": torch.get_num_threads(),
            **{name: os.environ.get(name) for name in THREAD_VARIABLES},
        },
        "kernels": {name: os.environ.get(name) for name in PINNED_CPU_KERNELS},  # None: the CPU's own
        "machine": {
            "platform": platform.platform(),
            "cpu": cpu_model(),
            "logical_cores": os.cpu_count(),
            "memory_gib": None if memory is None else round(memory / 2**30, 1),
        },
        "git": git_state(repo),
    }

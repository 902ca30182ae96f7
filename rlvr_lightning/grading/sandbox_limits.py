"""`SandboxLimits`: what one sandboxed run of a program may use."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """The limits of one sandboxed run (`sandbox.run_python_tests`, `sandbox.run_python`).

    timeout_s: wall-clock seconds, enforced by the bootstrap and, as a second line, by the caller.
    memory_mb: address space (RLIMIT_AS).
    cpu_s: CPU seconds (RLIMIT_CPU).
    max_processes: processes and threads (RLIMIT_NPROC).
    max_file_mb: size of every file the program writes, its stdout included (RLIMIT_FSIZE).
    """

    timeout_s: float = 5.0
    memory_mb: int = 512
    cpu_s: int = 5
    max_processes: int = 16
    max_file_mb: int = 1

    def __post_init__(self) -> None:
        timeout = self.timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"sandbox limit timeout_s must be a number of seconds > 0, got {timeout!r}")
        for name in ("memory_mb", "cpu_s", "max_processes", "max_file_mb"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"sandbox limit {name} must be an integer >= 1, got {value!r}")


DEFAULT_LIMITS = SandboxLimits()  # frozen, so one shared instance serves as every default

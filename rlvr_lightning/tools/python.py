"""`PythonTool`: runs the model's code in the sandbox of `grading/sandbox.py` and shows its output.

Every call is one sandboxed run (own filesystem, no network, its own pid namespace, CPU, memory, process
and file-size limits, a wall-clock time-out; see that module). What the program prints to stdout is the
observation (cut to `max_output_chars`); a program that fails, is killed or times out gives an error
observation ("error: ..." with the last line of its traceback) and counts as a tool error, never as a
crashed run. Each call is a fresh interpreter: nothing carries over between calls.
"""

from __future__ import annotations

from typing import Any

from rlvr_lightning.grading.sandbox import run_python
from rlvr_lightning.grading.sandbox_limits import SandboxLimits
from rlvr_lightning.tools.base import Tool, ToolError


class PythonTool(Tool):
    default_name = "python"

    def __init__(
        self,
        name: str | None = None,
        timeout_s: float = SandboxLimits.timeout_s,
        memory_mb: int = SandboxLimits.memory_mb,
        cpu_s: int = SandboxLimits.cpu_s,
        max_processes: int = SandboxLimits.max_processes,
        max_output_chars: int = 1000,
        allow_network_unisolated: bool = False,
    ) -> None:
        """
        Args:
            timeout_s, memory_mb, cpu_s, max_processes: the sandbox's limits for one call (`SandboxLimits`).
            max_output_chars: stdout shown to the policy (the rest is cut, with a note).
            allow_network_unisolated: run even where the OS cannot isolate network and filesystem
                (see `run_python_tests`); refused by default.
        """
        super().__init__(name)
        self.limits = SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb, cpu_s=cpu_s, max_processes=max_processes)
        self.max_output_chars = max_output_chars
        self.allow_network_unisolated = allow_network_unisolated

    def run(self, arguments: str | dict[str, Any]) -> str:
        code = self.text_argument(arguments, "code")
        if not code.strip():
            raise ToolError("no code to run")
        result = run_python(code, limits=self.limits, allow_network_unisolated=self.allow_network_unisolated)
        output = self._cut(result.stdout.rstrip("\n"))
        if result.error is not None:
            raise ToolError(f"{output}\n{result.error}" if output else result.error)
        return output if output else "(no output)"

    def _cut(self, text: str) -> str:
        if len(text) <= self.max_output_chars:
            return text
        return text[: self.max_output_chars] + f"\n... ({len(text) - self.max_output_chars} more characters)"

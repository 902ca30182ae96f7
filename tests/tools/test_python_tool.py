"""The Python tool runs code in the sandbox: its stdout is the observation; failures and time-outs raise
`ToolError` (an error observation), never anything else."""

from __future__ import annotations

import time

import pytest

from rlvr_lightning.tools import PythonTool, ToolError


def test_stdout_is_the_observation():
    assert PythonTool().run("print(sum(range(10)))\nprint('ok')") == "45\nok"
    assert PythonTool().run({"code": "x = 1"}) == "(no output)"


def test_a_failing_program_gives_its_output_and_last_traceback_line():
    with pytest.raises(ToolError, match=r"^partial\nexit code 1: ZeroDivisionError: division by zero$"):
        PythonTool().run("print('partial')\n1/0")


def test_a_hanging_program_times_out():
    started = time.perf_counter()
    with pytest.raises(ToolError, match="timed out after 1 s"):
        PythonTool(timeout_s=1.0, cpu_s=10).run("while True:\n    pass")  # the wall clock, not the CPU limit, ends it
    assert time.perf_counter() - started < 6


def test_the_sandbox_has_no_network_and_no_host_files():
    with pytest.raises(ToolError, match="Network is unreachable|OSError"):
        PythonTool().run("import socket; socket.create_connection(('1.1.1.1', 53), timeout=1)")
    assert PythonTool().run("import os; print(os.path.exists('/etc/passwd'))") == "False"


def test_long_output_is_cut():
    observation = PythonTool(max_output_chars=10).run("print('x' * 100)")
    assert observation == "x" * 10 + "\n... (90 more characters)"

"""`CodeExecutionReward`: run the response's Python program against the task's tests, in a sandbox.

    trainer:
      callbacks:
        - class_path: rlvr_lightning.rewards.code.CodeExecutionReward
          init_args: {tests_key: tests, timeout_s: 5.0, max_concurrency: 2}

The program is the last fenced ```` ```python ```` block of the response (else the last fenced
block). The row's ``metadata[tests_key]`` is a list of test cases (or a JSON string of one):
``{"input": stdin, "output": expected stdout}`` dicts and/or assertion strings such as
``"assert add(2, 3) == 5"``; an APPS-style ``{"inputs": [...], "outputs": [...]}`` dict works too.
The reward is the fraction of tests passed.

Every test runs in `rlvr_lightning.grading.run_python_tests`' sandbox (no network, a filesystem
of its own holding only the interpreter and its standard library, own pid namespace, rlimits,
wall-clock kill): a hostile program (infinite loop, fork bomb, memory hog, file reads and writes,
host sockets, ``os.system``, ctypes, killing its parent) scores 0 and leaves the host as it was.
Assertion tests are judged outside the program's process, so a program cannot forge a pass (an
``__eq__`` that always agrees, a marker read from its own source, ``sys.settrace`` over the
asserts); the sandbox module's docstring lists what a program can still do. An assertion test
that cannot be judged that way (statements other than ``import``/``assert``, program calls on a
comprehension's variable) makes its row raise: it scores 0 and counts in ``num_errors``.

Rows run concurrently in a small thread pool (each test is a subprocess, so threads suffice);
identical (program, tests) pairs of a batch run once. A row whose run raises scores 0 and counts
in ``num_errors``.

If the host cannot isolate the network and filesystem the reward refuses to run
(`SandboxUnavailable`, raised whatever ``on_error`` says) unless ``allow_network_unisolated: true``.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor

from rlvr_lightning.grading.sandbox import SandboxUnavailable, extract_python_program, run_python_tests
from rlvr_lightning.grading.sandbox_limits import SandboxLimits
from rlvr_lightning.rewards.base import RewardCallback
from rlvr_lightning.rewards.math import metadata_values, response_texts
from rlvr_lightning.rollout import Rollout

log = logging.getLogger(__name__)


def parse_tests(tests) -> list:
    """A row's test cases: a list, or a JSON string of one."""
    if isinstance(tests, str):
        tests = json.loads(tests)
    if isinstance(tests, dict):
        # {"inputs": [...], "outputs": [...]} (APPS / TACO style)
        if "inputs" in tests and "outputs" in tests:
            return [{"input": i, "output": o} for i, o in zip(tests["inputs"], tests["outputs"], strict=True)]
        raise ValueError(f"test cases must be a list or {{'inputs', 'outputs'}}, got keys {sorted(tests)}")
    if not isinstance(tests, (list, tuple)):
        raise ValueError(f"test cases must be a list, got {type(tests).__name__}")
    return list(tests)


class CodeExecutionReward(RewardCallback):
    """Fraction of the row's test cases that the response's Python program passes."""

    kind = "task"

    def __init__(
        self,
        tests_key: str = "tests",
        timeout_s: float = SandboxLimits.timeout_s,
        memory_mb: int = SandboxLimits.memory_mb,
        cpu_s: int = SandboxLimits.cpu_s,
        max_processes: int = SandboxLimits.max_processes,
        max_concurrency: int = 2,
        allow_network_unisolated: bool = False,
        weight: float = 1.0,
        name: str | None = None,
        on_error: str = "zero",
    ) -> None:
        """
        Args:
            tests_key: the metadata field holding the test cases.
            timeout_s: per-run wall-clock limit (`SandboxLimits`).
            memory_mb: per-run memory limit.
            cpu_s: per-run CPU-time limit.
            max_processes: per-run process-count limit.
            max_concurrency: rows run at the same time (threads, each waiting on sandboxed subprocesses).
            allow_network_unisolated: run even where no network namespace is available (not recommended).
        """
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        super().__init__(weight=weight, name=name or "code_execution", on_error=on_error)
        self.tests_key = tests_key
        self.limits = SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb, cpu_s=cpu_s, max_processes=max_processes)
        self.max_concurrency = max_concurrency
        self.allow_network_unisolated = allow_network_unisolated
        self.last_errors: list[str | None] = []  # the first failure of each row of the last batch (debugging)

    def __call__(self, rollout: Rollout) -> Tensor:
        # No isolation is a property of the host, not of a row: stop the run whatever on_error says.
        if not self.allow_network_unisolated:
            from rlvr_lightning.grading.sandbox import sandbox_capabilities

            caps = sandbox_capabilities()
            if not caps["network_isolated"]:
                raise SandboxUnavailable(
                    "CodeExecutionReward: this host cannot isolate sandboxed programs (network, filesystem; "
                    + "; ".join(caps["errors"])[:500]
                    + "); set allow_network_unisolated: true to run untrusted code anyway"
                )
        return super().__call__(rollout)

    def score(self, rollout: Rollout) -> Tensor:
        texts = response_texts(rollout, type(self).__name__)
        raw_tests = metadata_values(rollout, self.tests_key, type(self).__name__)
        scores = torch.zeros(rollout.num_rows)
        self.last_errors = [None] * rollout.num_rows
        jobs: dict[str, list[int]] = {}  # identical (program, tests) pairs run once
        programs: list[str | None] = [None] * rollout.num_rows
        tests: list[list] = [[] for _ in range(rollout.num_rows)]
        for i, text in enumerate(texts):
            try:
                tests[i] = parse_tests(raw_tests[i])
                programs[i] = extract_python_program(text)
                key = json.dumps([programs[i], tests[i]], sort_keys=True, default=str)
            except Exception as error:
                self._row_failed([i], error)
                continue
            jobs.setdefault(key, []).append(i)
        if not jobs:
            return scores.to(rollout.response_ids.device)

        def run(i: int):
            return run_python_tests(
                programs[i], tests[i], limits=self.limits, allow_network_unisolated=self.allow_network_unisolated
            )

        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(jobs))) as pool:
            futures = [(rows, pool.submit(run, rows[0])) for rows in jobs.values()]
            for rows, future in futures:
                try:
                    result = future.result()
                except Exception as error:
                    self._row_failed(rows, error)
                    continue
                for i in rows:
                    scores[i] = result.reward
                    self.last_errors[i] = result.error
        return scores.to(rollout.response_ids.device)

    def _row_failed(self, rows: list[int], error: Exception) -> None:
        if self.on_error == "raise" or isinstance(error, SandboxUnavailable):
            raise error
        for i in rows:
            self.row_failed(i, error)
            self.last_errors[i] = f"{type(error).__name__}: {error}"[:500]

    def is_correct(self, rollout: Rollout, scores: Tensor) -> Tensor:
        return scores >= 1.0

    def feedback(self, rollout: Rollout, scores: Tensor) -> list[str | None]:
        """The first failure of each response that did not pass every test (the sandbox's error: a failed test's
        expected and actual output, an exception, a time-out)."""
        passed = (scores >= 1.0).tolist()
        return [None if ok else error for ok, error in zip(passed, self.last_errors, strict=False)]


__all__ = ["CodeExecutionReward", "parse_tests"]

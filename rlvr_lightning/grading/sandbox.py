"""Run untrusted Python programs against test cases, isolated, in a child process.

Each test case is one run of ``python -I -S -B prog.py`` started by
``_sandbox_boot.py``. What a run gets (see ``sandbox_capabilities()`` for what this
host actually allows):

* fresh network namespace: no interface but a downed loopback, so no connection to
  anything, including the host's 127.0.0.1 and abstract Unix sockets;
* its own filesystem: a fresh mount namespace whose root is an empty tmpfs holding
  read-only bind mounts of the interpreter, its standard library and the shared
  libraries it loads (``sandbox_root.interpreter_files``), ``/dev/{null,zero,random,
  urandom}``, a private size-limited ``/tmp`` whose ``/tmp/work`` is the working
  directory, and a ``/proc`` of its own pid namespace; the host's tree is detached
  (``pivot_root``): no host file, Unix socket, ``/etc/passwd`` or ``/run`` exists for it;
* fresh pid namespace with the program as its init: when it ends or is killed, the
  kernel kills every process it left behind (fork bombs, daemons, ``setsid``);
* as root: runs as ``nobody`` (uid 65534) inside a user namespace of its own (so the
  RLIMIT_NPROC count is per run); as a normal user: an unprivileged user namespace,
  same uid as the caller;
* rlimits: CPU seconds, address space, processes, file size, no core dumps, 256 fds;
  ``PR_SET_NO_NEW_PRIVS``; a minimal environment (no inherited variables);
* a wall-clock timeout enforced by the bootstrap (kills the namespace's init) and,
  as a second line, by the caller (kills the bootstrap's process group).

Without these namespaces (no network namespace, no mount namespace or ``pivot_root``)
the sandbox refuses to run unless ``allow_network_unisolated=True``, which runs the
program on the host's filesystem with network access (rlimits, uid and time-outs only).

No ``preexec_fn``: it is not thread-safe (Python docs, subprocess.Popen) and a
Lightning trainer runs threads; every step between fork and exec is done by the
bootstrap, a fresh single-threaded interpreter.

Judging. Input/output tests compare stdout in the caller. Assertion tests are judged
outside the program's process (`assertion_tests`): the program's run only reports the
plain values of the calls the assertion makes (``add(2, 3)``), and a second sandboxed
run that never executes program code evaluates the assertion on them, so the expected
values never reach the program. Forgeries that do not pass: an object (or int
subclass) whose ``__eq__`` always agrees, a success marker read from its own source,
``sys.settrace`` jumping over assertions, ``sys.exit(0)`` / ``os._exit(0)`` before the
checks, a patched encoder (``tests/grading/test_sandbox_hostile.py``). What remains
possible: a program controls the values it returns, so a weak assertion (``assert
f(2)``, ``assert f(2) != 5``) is passed by any value that satisfies it, and a program
that special-cases the inputs it is called with passes the tests it saw (it never sees
the expected outputs). Assertions that would have to be evaluated inside the program's
process (program calls on a variable bound in a comprehension or lambda of the
assertion, statements other than ``import``/``assert``) are refused, not judged.

Caveats: without root on a kernel older than 5.14, RLIMIT_NPROC counts all the
caller's processes, so ``max_processes`` must exceed what the caller already runs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import shutil
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from rlvr_lightning.grading.assertion_tests import (
    SplitTest,
    UnsupportedTest,
    judge_source,
    parse_probe_line,
    probe_source,
    split_assertion,
)
from rlvr_lightning.grading.sandbox_limits import DEFAULT_LIMITS, SandboxLimits
from rlvr_lightning.grading.sandbox_process import run_once

__all__ = [
    "ProgramRun",
    "SandboxResult",
    "SandboxUnavailable",
    "extract_python_program",
    "run_python",
    "run_python_tests",
    "sandbox_capabilities",
]

_PROBE_LIMITS = SandboxLimits(timeout_s=10.0, cpu_s=10)  # the runs that find which isolation works here


class SandboxUnavailable(RuntimeError):
    """No network and filesystem isolation is possible here and the caller did not opt out."""


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    passed: int
    total: int
    error: str | None = None

    @property
    def reward(self) -> float:
        return self.passed / self.total if self.total else 0.0


@dataclasses.dataclass(frozen=True)
class ProgramRun:
    """One sandboxed run of a program (`run_python`)."""

    status: str  # "exit", "timeout", "signal" or "setup_error"
    exit_code: int | None
    stdout: str
    stderr: str
    error: str | None = None  # why it did not exit with code 0, in one line


# --------------------------------------------------------------------------- extraction

_FENCE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n", re.MULTILINE)
_FENCE_END = re.compile(r"^[ \t]*```[ \t]*$", re.MULTILINE)


def extract_python_program(completion: str | None) -> str | None:
    """The last ```python fenced block of a completion, else the last ``` block."""
    if not completion:
        return None
    blocks: list[tuple[str, str]] = []
    pos = 0
    while True:
        m = _FENCE.search(completion, pos)
        if m is None:
            break
        end = _FENCE_END.search(completion, m.end())
        if end is None:
            break
        blocks.append((m.group(1).lower(), completion[m.end() : end.start()]))
        pos = end.end()
    if not blocks:
        return None
    for lang, body in reversed(blocks):
        if lang in ("python", "py", "python3"):
            return body.strip("\n") or None
    return blocks[-1][1].strip("\n") or None


# --------------------------------------------------------------------------- probing

_PROBE_LOCK = threading.Lock()
_PROBE: dict[str, Any] | None = None


def _python_candidates() -> list[str]:
    cands = [sys.executable, getattr(sys, "_base_executable", ""), os.path.realpath(sys.executable)]
    for d in ("/usr/bin", "/bin", "/usr/local/bin"):
        cands.append(shutil.which("python3", path=d) or "")
    out: list[str] = []
    for c in cands:
        if c and c not in out and os.path.exists(c):
            out.append(c)
    return out


def _mode_candidates() -> list[tuple[str, bool]]:
    if os.geteuid() == 0:
        return [("root", True), ("root", False)]
    return [("user", False)]


def sandbox_capabilities(refresh: bool = False) -> dict[str, Any]:
    """Probe (once per process) which isolation works here.

    Returns ``{"network_isolated": bool, "mode": "root"|"user"|"none", "child_userns":
    bool, "python": path, "features": [...], "errors": [...]}``.
    """
    global _PROBE
    with _PROBE_LOCK:
        if _PROBE is not None and not refresh:
            return _PROBE
        errors: list[str] = []
        found: dict[str, Any] | None = None
        for mode, child_userns in _mode_candidates():
            for py in _python_candidates():
                r = run_once("print(6*7)", None, _PROBE_LIMITS, mode=mode, child_userns=child_userns, python=py)
                if r["status"] == "exit" and r["code"] == 0 and r["stdout"].strip() == "42":
                    found = {
                        "network_isolated": True,
                        "mode": mode,
                        "child_userns": child_userns,
                        "python": py,
                        "features": r.get("features", []),
                        "errors": errors,
                    }
                    break
                errors.append(
                    f"{mode}{'+userns' if child_userns else ''} {py}: "
                    f"{r.get('error') or r['status']} {r['stderr'][-300:]}".strip()
                )
            if found:
                break
        if found is None:
            found = {
                "network_isolated": False,
                "mode": "none",
                "child_userns": False,
                "python": _unisolated_python(),
                "features": [],
                "errors": errors,
            }
        _PROBE = found
        return found


_UNISOLATED_PYTHON: list[str] = []


def _unisolated_python() -> str:
    """The first interpreter that runs without namespaces, as the sandbox's uid (probed once)."""
    if not _UNISOLATED_PYTHON:
        chosen = _python_candidates()[0]
        for cand in _python_candidates():
            r = run_once("print(6*7)", None, _PROBE_LIMITS, mode="none", child_userns=False, python=cand)
            if r["status"] == "exit" and r["stdout"].strip() == "42":
                chosen = cand
                break
        _UNISOLATED_PYTHON.append(chosen)
    return _UNISOLATED_PYTHON[0]


def _same_output(got: str, expected: str) -> bool:
    norm = lambda s: "\n".join(line.rstrip() for line in s.strip().splitlines())  # noqa: E731
    return norm(got) == norm(expected)


def _describe_failure(i: int, r: Mapping[str, Any], what: str) -> str:
    st = r["status"]
    if st == "timeout":
        return f"test {i}: timeout"
    if st == "signal":
        name = signal.Signals(r["signal"]).name if r["signal"] in signal.Signals._value2member_map_ else r["signal"]
        return f"test {i}: killed by {name}"
    if st == "setup_error":
        return f"test {i}: sandbox set-up failed: {r.get('error')}"
    if st == "exit" and r["code"] != 0:
        lines = [ln for ln in r.get("stderr", "").strip().splitlines() if ln.strip()]
        return f"test {i}: exit code {r['code']}" + (f": {lines[-1][:200]}" if lines else "")
    return f"test {i}: {what}"


def run_python_tests(
    program: str | None,
    tests: Sequence[Mapping[str, str] | str],
    *,
    limits: SandboxLimits = DEFAULT_LIMITS,
    allow_network_unisolated: bool = False,
) -> SandboxResult:
    """Run ``program`` on each test case in the sandbox; ``passed/total`` is the reward.

    A test case is either ``{"input": stdin, "output": expected_stdout}`` (passes when
    the exit code is 0 and stdout equals the expected output up to surrounding
    whitespace and trailing spaces per line) or an assertion string such as
    ``"assert f(2) == 4"``, judged outside the program's process (`assertion_tests`:
    the program's run reports the plain values of ``f(2)``, a second sandboxed run
    that never executes program code checks them against the assertion). An assertion
    test that cannot be judged that way raises ValueError before anything runs.

    ``limits`` apply to each run; after the first timeout the remaining tests are not
    run (they fail), so a hanging program costs the caller about one ``limits.timeout_s``.
    """
    total = len(tests)
    if total == 0:
        return SandboxResult(0, 0, "no tests")
    split: dict[int, SplitTest] = {}
    for i, case in enumerate(tests):
        if isinstance(case, str):
            try:
                split[i] = split_assertion(case)
            except UnsupportedTest as error:
                raise ValueError(f"test {i}: {error}: {case[:200]!r}") from None
        elif not (isinstance(case, Mapping) and "input" in case and "output" in case):
            raise ValueError(f"test {i}: expected an assertion string or {{'input', 'output'}}, got {case!r}"[:300])
    if not program or not program.strip():
        return SandboxResult(0, total, "no program")
    opts = _run_options(limits, allow_network_unisolated)
    passed = 0
    errors: dict[int, str] = {}
    to_judge: list[tuple[int, str]] = []  # assertion tests whose values came back: (test, outcomes JSON)
    for i, case in enumerate(tests):
        if i in split:
            nonce = "rlvr-values-" + secrets.token_hex(8)
            r = run_once(probe_source(program, split[i], nonce), None, **opts)
            outcomes = parse_probe_line(r["stdout"], nonce) if r["status"] == "exit" and r["code"] == 0 else None
            if outcomes is not None:
                to_judge.append((i, outcomes))
                continue
            what = "the program ended before its functions could be called"
        else:
            r = run_once(program, str(case["input"]), **opts)
            if r["status"] == "exit" and r["code"] == 0 and _same_output(r["stdout"], str(case["output"])):
                passed += 1
                continue
            what = "wrong answer"
        errors[i] = _describe_failure(i, r, what)
        if r["status"] == "timeout":
            if i + 1 < total:
                errors[i] += f" (remaining {total - i - 1} tests not run)"
            break
    if to_judge:
        verdicts = _judge([split[i] for i, _ in to_judge], [outcomes for _, outcomes in to_judge], opts)
        for (i, _), (ok, reason) in zip(to_judge, verdicts, strict=True):
            if ok:
                passed += 1
            else:
                errors[i] = f"test {i}: {reason} ({split[i].source.strip()[:120]})"
    return SandboxResult(passed, total, errors[min(errors)] if errors else None)


def _run_options(limits: SandboxLimits, allow_network_unisolated: bool) -> dict[str, Any]:
    caps = sandbox_capabilities()
    if not caps["network_isolated"] and not allow_network_unisolated:
        raise SandboxUnavailable(
            "cannot isolate sandboxed programs on this host (no usable network, mount and pid namespaces "
            "for a private filesystem view: " + "; ".join(caps["errors"])[:1000] + "). Pass "
            "allow_network_unisolated=True to run untrusted code with network and filesystem access anyway "
            "(rlimits, uid and time-outs still apply)."
        )
    python = caps["python"] if caps["mode"] != "none" else _unisolated_python()
    return dict(limits=limits, mode=caps["mode"], child_userns=caps["child_userns"], python=python)


def run_python(
    program: str,
    stdin: str | None = None,
    *,
    limits: SandboxLimits = DEFAULT_LIMITS,
    allow_network_unisolated: bool = False,
) -> ProgramRun:
    """Run ``program`` once in the sandbox (same isolation and limits as ``run_python_tests``) and return
    its output, for callers that show it rather than judge it (the Python tool of multi-turn rollouts)."""
    opts = _run_options(limits, allow_network_unisolated)
    r = run_once(program, stdin, **opts)
    ok = r["status"] == "exit" and r["code"] == 0
    error = None if ok else _describe_failure(0, r, "").removeprefix("test 0: ")
    if r["status"] == "timeout":
        error = f"timed out after {limits.timeout_s:g} s"
    return ProgramRun(r["status"], r.get("code"), r["stdout"], r["stderr"], error)


def _judge(tests: list[SplitTest], outcomes: list[str], opts: dict[str, Any]) -> list[tuple[bool, str | None]]:
    """(passed, reason) per test, from one sandboxed judge run that never executes program code."""
    payload = json.dumps([[t.imports, t.checks, o] for t, o in zip(tests, outcomes, strict=True)])
    r = run_once(judge_source(), payload, **opts)
    if r["status"] == "exit" and r["code"] == 0:
        try:
            verdicts = json.loads(r["stdout"].strip().splitlines()[-1])
            if len(verdicts) == len(tests):
                return [(bool(ok), None if ok else str(reason)) for ok, reason in verdicts]
        except (ValueError, IndexError, TypeError):
            pass
    failure = _describe_failure(0, r, "unreadable verdicts").removeprefix("test 0: ")
    return [(False, f"the judge failed: {failure}")] * len(tests)

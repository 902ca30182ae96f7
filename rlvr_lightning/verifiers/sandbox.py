"""Run untrusted Python programs against test cases, isolated, in a child process.

Each test case is one run of ``python -I -S -B prog.py`` started by
``_sandbox_boot.py``. What a run gets (see ``sandbox_capabilities()`` for what this
host actually allows):

* fresh network namespace: no interface but a downed loopback, so no connection to
  anything, including the host's 127.0.0.1 (mandatory: without it we refuse to run
  unless ``allow_network_unisolated=True``);
* fresh pid namespace with the program as its init: when it ends or is killed, the
  kernel kills every process it left behind (fork bombs, daemons, ``setsid``);
* fresh mount namespace: every host mount re-mounted read-only and nosuid, a new
  empty size-limited tmpfs as working directory, private tmpfs on ``/tmp``,
  ``/var/tmp``, ``/dev/shm``, a ``/proc`` showing only the sandbox's processes;
* as root: runs as ``nobody`` (uid 65534) inside a user namespace of its own (so the
  RLIMIT_NPROC count is per run); as a normal user: an unprivileged user namespace,
  same uid as the caller (see the caveats below);
* rlimits: CPU seconds, address space, processes, file size, no core dumps, 256 fds;
  ``PR_SET_NO_NEW_PRIVS``; a minimal environment (no inherited variables);
* a wall-clock timeout enforced by the bootstrap (kills the namespace's init) and,
  as a second line, by the caller (kills the bootstrap's process group).

No ``preexec_fn``: it is not thread-safe (Python docs, subprocess.Popen) and a
Lightning trainer runs threads; every step between fork and exec is done by the
bootstrap, a fresh single-threaded interpreter.

Caveats: without root, the program runs as the caller's uid in a user namespace:
files are read-only to it (when ``mount_setattr`` is available) but it can *read*
whatever the caller can read. Assertion tests print a random marker after the
assertions; a program that reads its own source could forge it (a deliberate
trade-off: the alternative, trusting the exit code, is beaten by ``sys.exit(0)``).
Without root on a kernel older than 5.14, RLIMIT_NPROC counts all the caller's
processes, so ``max_processes`` must exceed what the caller already runs. Where
``/proc`` cannot be re-mounted (``"private_proc"`` missing from
``sandbox_capabilities()["features"]``), a same-uid program can read the caller's
``/proc/<pid>/environ``; with no network it can only leak it through its own output.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Any, Mapping, Sequence

__all__ = [
    "SandboxResult",
    "SandboxUnavailable",
    "extract_python_program",
    "run_python_tests",
    "sandbox_capabilities",
]

_BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_boot.py")
_MIN_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
_NOBODY = 65534
_SLACK_S = 3.0  # caller-side grace on top of the bootstrap's own deadline


class SandboxUnavailable(RuntimeError):
    """No network isolation is possible here and the caller did not opt out."""


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    passed: int
    total: int
    error: str | None = None

    @property
    def reward(self) -> float:
        return self.passed / self.total if self.total else 0.0


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
                r = _run_once("print(6*7)", None, mode=mode, child_userns=child_userns, python=py,
                              timeout_s=10.0, memory_mb=512, cpu_s=10, nproc=16, fsize_mb=1)
                if r["status"] == "exit" and r["code"] == 0 and r["stdout"].strip() == "42":
                    found = {"network_isolated": True, "mode": mode, "child_userns": child_userns,
                             "python": py, "features": r.get("features", []), "errors": errors}
                    break
                errors.append(f"{mode}{'+userns' if child_userns else ''} {py}: "
                              f"{r.get('error') or r['status']} {r['stderr'][-300:]}".strip())
            if found:
                break
        if found is None:
            py = _python_candidates()[0]
            for cand in _python_candidates():
                r = _run_once("print(6*7)", None, mode="none", child_userns=False, python=cand,
                              timeout_s=10.0, memory_mb=512, cpu_s=10, nproc=16, fsize_mb=1)
                if r["status"] == "exit" and r["stdout"].strip() == "42":
                    py = cand
                    break
            found = {"network_isolated": False, "mode": "none", "child_userns": False, "python": py,
                     "features": [], "errors": errors}
        _PROBE = found
        return found


# --------------------------------------------------------------------------- running


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_capped(path: str, cap: int) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(cap).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _run_once(source: str, stdin: str | None, *, mode: str, child_userns: bool, python: str,
              timeout_s: float, memory_mb: int, cpu_s: int, nproc: int, fsize_mb: int) -> dict[str, Any]:
    """One isolated run. Returns the bootstrap's report plus ``stdout``/``stderr``."""
    stage = tempfile.mkdtemp(prefix="rlvr_sandbox_")  # 0700, ours: the program never sees it
    try:
        work = os.path.join(stage, "work")
        os.mkdir(work, 0o700)
        if mode == "none" and os.geteuid() == 0:
            # Without namespaces the program runs in this host directory as nobody: let it
            # traverse (not list) the staging directory to reach it.
            os.chown(work, _NOBODY, _NOBODY)
            os.chmod(stage, 0o711)
        prog = os.path.join(stage, "prog.py")
        with open(prog, "w", encoding="utf-8") as f:
            f.write(source)
        stdin_path = None
        if stdin is not None:
            stdin_path = os.path.join(stage, "stdin.txt")
            with open(stdin_path, "w", encoding="utf-8") as f:
                f.write(stdin)
        cfg = {
            "mode": mode, "child_userns": child_userns, "uid": _NOBODY, "gid": _NOBODY, "workdir": work,
            "program": prog, "stdin": stdin_path, "stdout": os.path.join(stage, "stdout"),
            "stderr": os.path.join(stage, "stderr"), "python": python, "timeout_s": float(timeout_s),
            "cpu_s": int(cpu_s), "memory_mb": int(memory_mb), "nproc": int(nproc), "fsize_mb": int(fsize_mb),
            "tmpfs_kb": max(4096, 8 * 1024 * int(fsize_mb)),
        }
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", _BOOT, json.dumps(cfg)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=dict(_MIN_ENV), close_fds=True, start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout_s + _SLACK_S)
            try:
                report = json.loads(out.decode().strip().splitlines()[-1])
            except (ValueError, IndexError):
                report = {"status": "setup_error", "error": f"bootstrap failed: {err.decode(errors='replace')[-500:]}"}
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.communicate()
            report = {"status": "timeout"}
        finally:
            _kill_group(proc.pid)  # stragglers of the group (only possible in mode "none")
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        cap = fsize_mb * 1024 * 1024 + 1
        report["stdout"] = _read_capped(cfg["stdout"], cap)
        report["stderr"] = _read_capped(cfg["stderr"], 64 * 1024)
        return report
    finally:
        shutil.rmtree(stage, ignore_errors=True)


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
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    cpu_s: int = 5,
    max_processes: int = 16,
    max_file_mb: int = 1,
    allow_network_unisolated: bool = False,
) -> SandboxResult:
    """Run ``program`` on each test case in the sandbox; ``passed/total`` is the reward.

    A test case is either ``{"input": stdin, "output": expected_stdout}`` (passes when
    the exit code is 0 and stdout equals the expected output up to surrounding
    whitespace and trailing spaces per line) or an assertion string such as
    ``"assert f(2) == 4"``, appended to the program (passes when the assertion and a
    random marker printed after it are reached, with exit code 0).

    ``timeout_s`` is the wall-clock limit of each run; after the first timeout the
    remaining tests are not run (they fail), so a hanging program costs the caller
    about one ``timeout_s``. ``max_processes`` is RLIMIT_NPROC (processes and threads)
    of the run, ``max_file_mb`` caps every file it writes, its stdout included.
    """
    total = len(tests)
    if total == 0:
        return SandboxResult(0, 0, "no tests")
    if not program or not program.strip():
        return SandboxResult(0, total, "no program")
    caps = sandbox_capabilities()
    if not caps["network_isolated"] and not allow_network_unisolated:
        raise SandboxUnavailable(
            "cannot isolate the network for sandboxed programs on this host (no usable network "
            "namespace: " + "; ".join(caps["errors"])[:1000] + "). Pass allow_network_unisolated=True to run "
            "untrusted code with network access anyway (rlimits, uid and time-outs still apply)."
        )
    passed = 0
    first_error: str | None = None
    opts = dict(mode=caps["mode"], child_userns=caps["child_userns"], python=caps["python"], timeout_s=timeout_s,
                memory_mb=memory_mb, cpu_s=cpu_s, nproc=max_processes, fsize_mb=max_file_mb)
    for i, case in enumerate(tests):
        if isinstance(case, str):
            marker = "rlvr-ok-" + secrets.token_hex(16)
            source = f"{program}\n\n{case}\n__import__('sys').stdout.write('\\n{marker}\\n')\n"
            r = _run_once(source, None, **opts)
            ok = r["status"] == "exit" and r["code"] == 0 and r["stdout"].rstrip().endswith(marker)
            what = "assertion failed"
        elif isinstance(case, Mapping) and "input" in case and "output" in case:
            r = _run_once(program, str(case["input"]), **opts)
            ok = r["status"] == "exit" and r["code"] == 0 and _same_output(r["stdout"], str(case["output"]))
            what = "wrong answer"
        else:
            raise ValueError(f"test {i}: expected an assertion string or {{'input', 'output'}}, got {case!r}"[:300])
        if ok:
            passed += 1
            continue
        if first_error is None:
            first_error = _describe_failure(i, r, what)
        if r["status"] == "timeout":
            if i + 1 < total:
                first_error += f" (remaining {total - i - 1} tests not run)"
            break
    return SandboxResult(passed, total, first_error)

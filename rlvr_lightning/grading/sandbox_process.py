"""One isolated run of a Python program: the bootstrap process (`_sandbox_boot.py`) and what the caller
does around it (staging directory, the wall-clock kill of the bootstrap's process group, capped reads of
the program's output). The isolation itself is described in `sandbox.py`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any

from rlvr_lightning.grading.sandbox_limits import SandboxLimits
from rlvr_lightning.grading.sandbox_root import interpreter_files

_BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_boot.py")
_MIN_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
NOBODY = 65534
SLACK_S = 3.0  # caller-side grace on top of the bootstrap's own deadline


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


def run_once(
    source: str, stdin: str | None, limits: SandboxLimits, *, mode: str, child_userns: bool, python: str
) -> dict[str, Any]:
    """One isolated run. Returns the bootstrap's report plus ``stdout``/``stderr``."""
    stage = tempfile.mkdtemp(prefix="rlvr_sandbox_")  # 0700, ours: the program never sees it
    try:
        work, prog, stdin_path = _stage_files(stage, source, stdin, mode)
        files: dict[str, Any] = {"binds": [], "hide": []}
        root = None
        if mode != "none":  # the program's whole filesystem: see _sandbox_boot.build_root
            try:
                files = interpreter_files(python)
            except (OSError, ValueError, subprocess.SubprocessError) as error:
                return {
                    "status": "setup_error",
                    "error": f"{type(error).__name__}: {error}",
                    "stdout": "",
                    "stderr": "",
                }
            root = os.path.join(stage, "root")
            os.mkdir(root, 0o755)
            python = files["python"]
        cfg = {
            "root": root,
            "binds": files["binds"],
            "hide": files["hide"],
            "mode": mode,
            "child_userns": child_userns,
            "uid": NOBODY,
            "gid": NOBODY,
            "workdir": work,
            "program": prog,
            "stdin": stdin_path,
            "stdout": os.path.join(stage, "stdout"),
            "stderr": os.path.join(stage, "stderr"),
            "python": python,
            "timeout_s": float(limits.timeout_s),
            "cpu_s": int(limits.cpu_s),
            "memory_mb": int(limits.memory_mb),
            "nproc": int(limits.max_processes),
            "fsize_mb": int(limits.max_file_mb),
            "tmpfs_kb": max(4096, 8 * 1024 * int(limits.max_file_mb)),
        }
        report = _boot(cfg, limits)
        cap = int(limits.max_file_mb) * 1024 * 1024 + 1
        report["stdout"] = _read_capped(cfg["stdout"], cap)
        report["stderr"] = _read_capped(cfg["stderr"], 64 * 1024)
        return report
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _stage_files(stage: str, source: str, stdin: str | None, mode: str) -> tuple[str, str, str | None]:
    """The program's working directory, its source file and its stdin file (None: no stdin) under `stage`."""
    work = os.path.join(stage, "work")
    os.mkdir(work, 0o700)
    if mode == "none" and os.geteuid() == 0:
        # Without namespaces the program runs in this host directory as nobody: let it
        # traverse (not list) the staging directory to reach it.
        os.chown(work, NOBODY, NOBODY)
        os.chmod(stage, 0o711)
    prog = os.path.join(stage, "prog.py")
    with open(prog, "w", encoding="utf-8") as f:
        f.write(source)
    stdin_path = None
    if stdin is not None:
        stdin_path = os.path.join(stage, "stdin.txt")
        with open(stdin_path, "w", encoding="utf-8") as f:
            f.write(stdin)
    return work, prog, stdin_path


def _boot(cfg: dict[str, Any], limits: SandboxLimits) -> dict[str, Any]:
    """Run the bootstrap on `cfg` within the time limit (plus slack); its report."""
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", _BOOT, json.dumps(cfg)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(_MIN_ENV),
        close_fds=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=limits.timeout_s + SLACK_S)
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
    return report

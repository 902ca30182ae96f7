"""The parent's handle on one math worker process (`_math_worker.py`): started from one lasting thread
(its `PR_SET_PDEATHSIG` fires when the forking thread exits), fed newline-delimited JSON requests,
read without blocking, killed with its process group and reaped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

_WORKER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_math_worker.py")


class Task:
    """A request in flight. Until the worker acknowledges it, `deadline` is the (generous) delivery
    deadline; from the acknowledgement on, it is the row's own time budget."""

    __slots__ = ("req_id", "deadline", "acked")

    def __init__(self, req_id: int, deadline: float) -> None:
        self.req_id = req_id
        self.deadline = deadline
        self.acked = False


_SPAWNER_LOCK = threading.Lock()
_SPAWNER: tuple[int, ThreadPoolExecutor] | None = None  # (owning pid, executor)


def _popen_from_a_lasting_thread(*args, **kwargs) -> subprocess.Popen:
    """``subprocess.Popen`` run on one long-lived thread of this process.

    A worker arms ``PR_SET_PDEATHSIG``, which fires when the *thread* that forked it exits
    (prctl(2)), not only the process: a worker started from a short-lived thread (a reward
    computed in a helper thread) would die with that thread."""
    global _SPAWNER
    with _SPAWNER_LOCK:
        if _SPAWNER is None or _SPAWNER[0] != os.getpid():  # none yet, or inherited across fork (no thread)
            _SPAWNER = (os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="math-worker-spawner"))
        spawner = _SPAWNER[1]
    return spawner.submit(subprocess.Popen, *args, **kwargs).result()


class MathWorker:
    """One ``_math_worker.py`` child; talks newline-delimited JSON over pipes."""

    def __init__(self, memory_mb: int, row_cpu_s: float) -> None:
        self.stderr = tempfile.TemporaryFile()
        self.proc = _popen_from_a_lasting_thread(
            [sys.executable, "-u", _WORKER_PATH, str(memory_mb), str(os.getpid()), str(row_cpu_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            close_fds=True,
            start_new_session=True,  # own process group: killable as a unit, no Ctrl-C
        )
        self.fd = self.proc.stdout.fileno()
        os.set_blocking(self.fd, False)
        self.buf = b""
        self.ready = False
        self.started = time.monotonic()
        self.task: Task | None = None

    def send(self, req_id: int, pred: str, gold: str, ack_deadline: float) -> bool:
        try:
            self.proc.stdin.write((json.dumps({"id": req_id, "p": pred, "g": gold}) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return False
        self.task = Task(req_id, ack_deadline)
        return True

    def read(self) -> list[dict] | None:
        """Complete messages available now; None once the worker has closed stdout."""
        try:
            chunk = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return []
        except OSError:
            return None
        if not chunk:
            return None
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def stderr_tail(self) -> str:
        try:
            self.stderr.seek(0)
            return self.stderr.read()[-2000:].decode(errors="replace")
        except Exception:
            return ""

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait()  # reap: no zombies
        for f in (self.proc.stdin, self.proc.stdout, self.stderr):
            try:
                f.close()
            except Exception:
                pass

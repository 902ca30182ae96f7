"""Math-verify workers die with the process that started them, whatever they are computing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# A stand-in trainer: one worker judging a power tower (one big-integer operation that never
# returns to the interpreter loop), generous budget; prints the worker pids once judging started.
TRAINER = r"""
import sys, threading, time
from rlvr_lightning.grading.math_equivalence import MathVerifier

verifier = MathVerifier(workers=1, timeout_s=600.0)

def report():
    while not verifier.judging_pids():
        time.sleep(0.01)
    time.sleep(0.5)  # well inside the big-integer power by now
    print(" ".join(map(str, verifier.judging_pids())), flush=True)

threading.Thread(target=report, daemon=True).start()
verifier.score([r"\boxed{9^{9^{9^8}}}"], ["1"])
print("finished", flush=True)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")  # a zombie is dead
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_die_when_the_trainer_is_sigkilled_mid_judgement():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
    )
    workers: list[int] = []
    try:
        line = trainer.stdout.readline()  # blocks until the worker is judging
        workers = [int(pid) for pid in line.split()]
        assert workers, (
            f"no worker reported: {line!r} {trainer.stderr.read()[-2000:] if trainer.poll() is not None else ''}"
        )
        assert all(_alive(pid) for pid in workers)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=10)
        time.sleep(2.0)
        survivors = [pid for pid in workers if _alive(pid)]
        assert survivors == [], f"workers {survivors} outlived the trainer by 2 s"
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)  # ours: do not leave a runaway judge behind


def test_cpu_allowance_per_row_kills_a_runaway_judge():
    from rlvr_lightning.grading.math_equivalence import MathVerifier

    # a wall-clock budget far away: only RLIMIT_CPU (1 CPU second per row) can stop this row
    with MathVerifier(workers=1, timeout_s=300.0, row_cpu_s=1.0) as verifier:
        t0 = time.monotonic()
        assert verifier.score([r"\boxed{9^{9^{9^8}}}", r"\boxed{1/2}"], ["1", "0.5"]) == ([0.0, 1.0], 1)
        assert time.monotonic() - t0 < 60  # killed by SIGXCPU; a replacement judged the second row


def test_workers_started_from_a_short_lived_thread_outlive_it():
    import threading

    from rlvr_lightning.grading.math_equivalence import MathVerifier

    with MathVerifier(workers=1, timeout_s=5.0) as verifier:
        thread = threading.Thread(target=verifier.score, args=([r"\boxed{1/4}"], ["0.25"]))  # judged: starts a worker
        thread.start()
        thread.join(timeout=60)
        (pid,) = verifier.worker_pids()
        time.sleep(0.5)  # PR_SET_PDEATHSIG would have fired when the thread exited, had it forked the worker
        assert _alive(pid) and verifier.worker_pids() == [pid]
        assert verifier.score([r"\boxed{2/4}"], ["0.5"]) == ([1.0], 0)

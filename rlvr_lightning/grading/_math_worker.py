"""Math-verify judging, in-process (``judge``) or as a worker process (``main``).

:class:`rlvr_lightning.grading.math_equivalence.MathVerifier` runs this file *by
path* (``python _math_worker.py``) so that the worker never imports the
``rlvr_lightning`` package (whose ``__init__`` imports torch): start-up stays about
half a second and a worker can be killed and replaced cheaply.

Protocol (newline-delimited JSON): the worker writes ``{"ready": true}`` once
math-verify is imported and warmed up (one judged pair, so lazy initialisation is
paid at start-up, not out of the first row's budget). For each request
``{"id": n, "p": pred, "g": gold}`` it first acknowledges receipt with
``{"ack": n}`` (the parent starts the row's time budget there) and then answers
``{"id": n, "ok": bool, "err": str|null}``. It exits on end of input or when its
parent dies. The parent enforces the per-row wall-clock budget (it kills the worker).

Dying with the parent must not need the interpreter: a worker inside one long big-integer
operation (``9^{9^{9^8}}``) never runs another Python thread. On Linux the kernel kills it
(``PR_SET_PDEATHSIG``, armed at start-up, then a check that the parent is still the one that
started it, which closes the race with a parent that died before the call); elsewhere a
watch thread does, between operations. As backstops the worker's address space is capped
(``RLIMIT_AS``) and each row gets a CPU-time allowance (``RLIMIT_CPU``, SIGXCPU kills it).
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import resource
import signal
import sys
import threading
import time

# Stop `python path/to/_math_worker.py` from putting the package directory first on
# sys.path (our module names must not shadow anything math-verify/sympy import).
if __name__ == "__main__" and sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

_MV = None  # (parse, verify, extraction_config), imported lazily


def _math_verify():
    global _MV
    if _MV is None:
        import logging

        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

        # math-verify warns once when its signal timeouts are disabled; we disable them
        # on purpose (the parent enforces the budget), so keep that warning out of logs.
        logging.getLogger("math_verify").setLevel(logging.ERROR)
        # boxed_match_priority=0: we hand math-verify "\boxed{answer}" (math-verify README,
        # "Extraction Targets": LatexExtractionConfig needs $..$ or \boxed anchors).
        cfg = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
        _MV = (parse, verify, cfg)
    return _MV


def judge(pred: str, gold: str, timeout_seconds: int | None = None) -> bool:
    """math-verify equivalence of two already-extracted, cleaned answers.

    ``timeout_seconds`` is passed to math-verify's own ``signal.alarm`` timeouts; it
    must be None outside the main thread (math-verify raises there otherwise).
    """
    if not pred or not gold:
        return False
    parse, verify, cfg = _math_verify()
    g = parse("\\boxed{" + gold + "}", extraction_config=cfg, parsing_timeout=timeout_seconds)
    if not g:
        return False
    p = parse("\\boxed{" + pred + "}", extraction_config=cfg, parsing_timeout=timeout_seconds)
    if not p:
        return False
    # verify(gold, target): the argument order matters (math-verify grader.verify docstring).
    return bool(verify(g, p, timeout_seconds=timeout_seconds))


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _watch_parent(parent: int) -> None:
    # Without PR_SET_PDEATHSIG: exit when the parent is gone (only between bytecodes, see above).
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(0)


def die_with_parent(parent: int) -> str:
    """Arrange to die when process ``parent`` does; exit now if it already has. Returns the mechanism."""
    mechanism = "watch thread"
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        # the kernel sends SIGKILL when the parent (the thread that forked us) exits  (prctl(2), PR_SET_PDEATHSIG)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
            mechanism = "pdeathsig"
    if os.getppid() != parent:  # the parent died before the signal was armed: re-parented already
        os._exit(0)
    if mechanism != "pdeathsig":
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    return mechanism


def allow_cpu_seconds(seconds: float) -> None:
    """Let the next row use ``seconds`` more CPU time (soft RLIMIT_CPU above what is used so far)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = math.ceil(usage.ru_utime + usage.ru_stime + seconds)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def main(argv: list[str]) -> int:
    memory_mb = int(argv[1]) if len(argv) > 1 else 0
    parent = int(argv[2]) if len(argv) > 2 else os.getppid()
    row_cpu_s = float(argv[3]) if len(argv) > 3 else 0.0
    die_with_parent(parent)
    # Keep the protocol channel private: anything else printing to stdout goes to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    if memory_mb > 0:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGXCPU's default action would dump core
    _math_verify()
    judge("1/2", "0.5")  # warm-up: math-verify/sympy initialise parsers lazily on first use
    proto.write('{"ready": true}\n')
    for line in sys.stdin:
        try:
            req = json.loads(line)
        except ValueError:
            continue
        if row_cpu_s > 0:
            allow_cpu_seconds(row_cpu_s)
        proto.write(json.dumps({"ack": req.get("id")}) + "\n")
        try:
            ok, err = judge(req["p"], req["g"]), None
        except BaseException as e:  # RecursionError, MemoryError, sympy bugs: score 0
            ok, err = False, f"{type(e).__name__}: {e}"[:500]
        proto.write(json.dumps({"id": req.get("id"), "ok": ok, "err": err}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

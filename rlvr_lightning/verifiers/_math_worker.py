"""Math-verify judging, in-process (``judge``) or as a worker process (``main``).

:class:`rlvr_lightning.verifiers.math_equivalence.MathVerifier` runs this file *by
path* (``python _math_worker.py``) so that the worker never imports the
``rlvr_lightning`` package (whose ``__init__`` imports torch): start-up stays about
half a second and a worker can be killed and replaced cheaply.

Protocol (newline-delimited JSON): the worker writes ``{"ready": true}`` once
math-verify is imported and warmed up (one judged pair, so lazy initialisation is
paid at start-up, not out of the first row's budget). For each request
``{"id": n, "p": pred, "g": gold}`` it first acknowledges receipt with
``{"ack": n}`` (the parent starts the row's time budget there) and then answers
``{"id": n, "ok": bool, "err": str|null}``. It exits on end of input or when its
parent dies. It never enforces time limits itself: the parent kills it.
"""

from __future__ import annotations

import json
import os
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


def _watch_parent(parent: int) -> None:
    # A worker stuck in sympy does not see EOF on stdin: exit when the parent is gone.
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(0)


def main(argv: list[str]) -> int:
    memory_mb = int(argv[1]) if len(argv) > 1 else 0
    # Keep the protocol channel private: anything else printing to stdout goes to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    if memory_mb > 0:
        import resource

        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    _math_verify()
    judge("1/2", "0.5")  # warm-up: math-verify/sympy initialise parsers lazily on first use
    proto.write('{"ready": true}\n')
    for line in sys.stdin:
        try:
            req = json.loads(line)
        except ValueError:
            continue
        proto.write(json.dumps({"ack": req.get("id")}) + "\n")
        try:
            ok, err = judge(req["p"], req["g"]), None
        except BaseException as e:  # RecursionError, MemoryError, sympy bugs: score 0
            ok, err = False, f"{type(e).__name__}: {e}"[:500]
        proto.write(json.dumps({"id": req.get("id"), "ok": ok, "err": err}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

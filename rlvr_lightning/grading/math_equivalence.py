"""Math answer equivalence with math-verify, safely: killable worker processes.

``answers_match`` is the in-process predicate (fine for trusted strings and tests).
:class:`MathVerifier` is what a reward function should use on model output:

* extraction (``answers.extract_answer``) and the string fast path run in the
  caller, in linear time; answers longer than ``max_answer_chars`` score 0 unjudged;
* the math-verify/sympy part runs in a small pool of worker *processes* (plain
  ``subprocess`` children running ``_math_worker.py``), one request at a time each,
  with a wall-clock budget per request. sympy cannot be interrupted cooperatively
  (``9^{9^{9^9}}`` never returns) and math-verify's own ``signal.alarm`` timeouts
  only work in the main thread, so the parent kills a worker that overruns
  (SIGKILL to its process group), reaps it and starts a replacement, while the
  other workers keep judging the remaining rows.

A row's budget starts when a ready, warmed-up worker acknowledges the row, so neither
a replacement worker's start-up (which has its own, generous ``startup_timeout_s``)
nor a worker that died between rows can cost a row its verdict.
"""

from __future__ import annotations

import atexit
import collections
import os
import select
import threading
import time
import weakref
from collections.abc import Sequence

from rlvr_lightning.grading._math_worker import judge as _judge
from rlvr_lightning.grading.answers import DEFAULT_METHODS, clean_answer, extract_answer, normalize_answer
from rlvr_lightning.grading.math_worker_process import MathWorker

__all__ = ["MathVerifier", "answers_match"]


def answers_match(prediction: str | None, gold: str | None, *, timeout_seconds: int | None = 5) -> bool:
    """True if two extracted answers are mathematically equivalent.

    ``1/2``, ``0.5`` and ``\\frac{1}{2}`` agree; ``1,000`` and ``1000``; ``$5`` and ``5``.
    Normalised string equality (``normalize_answer``) decides when math-verify cannot
    parse. Runs in-process: math-verify's ``signal.alarm`` timeout (``timeout_seconds``)
    only works in the main thread and is dropped elsewhere, so for untrusted input
    use :class:`MathVerifier`, which can kill a runaway sympy call.
    """
    if not prediction or not gold:
        return False
    n_pred, n_gold = normalize_answer(prediction), normalize_answer(gold)
    if not n_pred or not n_gold:
        return False
    if n_pred == n_gold:
        return True
    if threading.current_thread() is not threading.main_thread():
        timeout_seconds = None
    try:
        return _judge(clean_answer(prediction), clean_answer(gold), timeout_seconds)
    except Exception:
        return False


_LIVE: weakref.WeakSet[MathVerifier] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for v in list(_LIVE):
        v.close()


class MathVerifier:
    """Scores predictions against gold answers with math-verify in killable workers.

    Args:
        workers: number of worker processes (started lazily, on the first ``score``).
        timeout_s: wall-clock budget for judging one (prediction, gold) pair, counted
            from the moment a ready worker acknowledges receiving it (not from when it was
            queued or sent; worker start-up never eats into it). On expiry the worker is
            killed and replaced and the row scores 0. A worker that dies or stalls before
            acknowledging a row (killed from outside, OOM killer, starved) is replaced and
            the row is re-sent (at most twice) instead of being scored.
        extract: if True, ``predictions`` are raw completions and the answer is taken
            with ``extract_answer(text, methods)``; if False they are answers already.
            Golds are always answers (e.g. ``extract_gsm8k(solution)`` for GSM8K).
        methods: extraction methods, in order (see ``answers.extract_answer``).
        max_answer_chars: longer extracted answers score 0 without being parsed; longer
            golds are only compared as normalised strings.
        memory_mb: address-space limit of each worker (0 = none).
        row_cpu_s: CPU seconds a worker may spend on one row before the kernel kills it (a backstop
            for when this process cannot kill it in time; default ``2 * timeout_s + 1``; 0 = none).
        startup_timeout_s: how long a worker may take to import math-verify and warm up,
            and how long a ready worker may take to acknowledge a request.
        string_fast_path: score identical normalised strings 1.0 without math-verify
            (turn off to make math-verify judge every pair, e.g. to test it).
    """

    def __init__(
        self,
        workers: int = 2,
        timeout_s: float = 5.0,
        *,
        extract: bool = True,
        methods: Sequence[str] = DEFAULT_METHODS,
        max_answer_chars: int = 2000,
        memory_mb: int = 2048,
        startup_timeout_s: float = 60.0,
        string_fast_path: bool = True,
        row_cpu_s: float | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        self.num_workers = int(workers)
        self.timeout_s = float(timeout_s)
        self.extract = extract
        self.methods = tuple(methods)
        self.max_answer_chars = int(max_answer_chars)
        self.memory_mb = int(memory_mb)
        self.row_cpu_s = 2 * self.timeout_s + 1 if row_cpu_s is None else float(row_cpu_s)
        self.startup_timeout_s = float(startup_timeout_s)
        self.string_fast_path = bool(string_fast_path)
        self._workers: list[MathWorker] = []
        self._seq = 0  # request ids are unique across calls: a stale reply can never match
        self._owner_pid = os.getpid()
        self._lock = threading.Lock()
        self._closed = False
        _LIVE.add(self)

    # ------------------------------------------------------------------ public API

    def score(
        self, predictions: Sequence[str | None], golds: Sequence[str | None], extract: bool | None = None
    ) -> tuple[list[float], int]:
        """Per-row 1.0/0.0 and the number of rows whose judging timed out or crashed; `extract`: whether the
        predictions are texts to extract an answer from (None: the verifier's `extract`) or answers already."""
        extract = self.extract if extract is None else extract
        if len(predictions) != len(golds):
            raise ValueError(f"{len(predictions)} predictions but {len(golds)} golds")
        scores = [0.0] * len(predictions)
        jobs: dict[tuple[str, str], list[int]] = collections.OrderedDict()
        string_equal: set[int] = set()
        for i, (pred, gold) in enumerate(zip(predictions, golds, strict=True)):
            if pred is None or gold is None:
                continue
            ans = extract_answer(pred, self.methods) if extract else str(pred)
            if not ans or len(ans) > self.max_answer_chars:
                continue
            gold = str(gold)
            n_ans, n_gold = normalize_answer(ans), normalize_answer(gold)
            if not n_ans or not n_gold:
                continue
            if n_ans == n_gold:
                if self.string_fast_path:  # identical after normalisation: no need to ask
                    scores[i] = 1.0
                    continue
                string_equal.add(i)  # judged by math-verify anyway, with string equality as fallback
            if len(gold) > self.max_answer_chars:
                scores[i] = 1.0 if i in string_equal else 0.0
                continue
            jobs.setdefault((clean_answer(ans), clean_answer(gold)), []).append(i)
        if not jobs:
            return scores, 0
        keys = list(jobs)
        with self._lock:
            if self._closed:
                raise RuntimeError("MathVerifier is closed")
            verdicts = self._judge_all(keys)
        failed = 0
        for key, verdict in zip(keys, verdicts, strict=True):
            for i in jobs[key]:
                if verdict or i in string_equal:
                    scores[i] = 1.0
                elif verdict is None:
                    failed += 1  # timed out or crashed: scores 0
        return scores, failed

    def close(self) -> None:
        """Kill and reap all workers. Idempotent; the verifier cannot be used after."""
        with self._lock:
            self._closed = True
            self._stop_workers()
        _LIVE.discard(self)

    def __enter__(self) -> MathVerifier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._closed:
                self._stop_workers()
        except Exception:
            pass

    def worker_pids(self) -> list[int]:
        """PIDs of the live workers (for tests and debugging)."""
        return [w.proc.pid for w in self._workers if w.proc.poll() is None]

    def judging_pids(self) -> list[int]:
        """PIDs of the workers judging an acknowledged request right now (for tests and debugging)."""
        return [w.proc.pid for w in list(self._workers) if w.task is not None and w.task.acked]

    # ------------------------------------------------------------------ internals

    def _stop_workers(self) -> None:
        if os.getpid() != self._owner_pid:
            # Forked child (e.g. a DataLoader worker): these processes are the parent's.
            self._workers = []
            return
        for w in self._workers:
            w.kill()
        self._workers = []

    def _ensure_workers(self) -> None:
        if os.getpid() != self._owner_pid:
            self._workers = []  # inherited across fork: not ours to use
            self._owner_pid = os.getpid()
        self._workers = [w for w in self._workers if w.proc.poll() is None or w.kill()]
        while len(self._workers) < self.num_workers:
            self._workers.append(MathWorker(self.memory_mb, self.row_cpu_s))

    def _replace(self, w: MathWorker) -> None:
        w.kill()
        self._workers[self._workers.index(w)] = MathWorker(self.memory_mb, self.row_cpu_s)

    def _judge_all(self, keys: list[tuple[str, str]]) -> list[bool | None]:
        """Verdict per key: True/False, or None if it timed out or crashed the worker."""
        try:
            return self._judge_all_unsafe(keys)
        except BaseException:
            # Interrupted (KeyboardInterrupt, start-up failure...): workers still busy with
            # this call's requests would answer late, so replace them.
            for w in list(self._workers):
                if w.task is not None:
                    self._replace(w)
            raise

    MAX_RESENDS = 2  # a row whose worker died before acknowledging it is re-sent at most this often

    def _judge_all_unsafe(self, keys: list[tuple[str, str]]) -> list[bool | None]:
        results: list[bool | None] = [None] * len(keys)
        pending = collections.deque(range(len(keys)))
        local: dict[int, int] = {}  # request id -> index into keys
        resends: collections.Counter[int] = collections.Counter()
        startup_failures = 0

        def undelivered(w: MathWorker) -> None:
            """`w` died or stalled before acknowledging its row: not the row's fault, send it again."""
            k = local[w.task.req_id]
            resends[k] += 1
            if resends[k] <= self.MAX_RESENDS:
                pending.appendleft(k)
            else:
                results[k] = None

        self._ensure_workers()
        while pending or any(w.task is not None for w in self._workers):
            now = time.monotonic()
            for w in list(self._workers):
                if w.ready and w.task is None and pending:
                    k = pending.popleft()
                    self._seq += 1
                    local[self._seq] = k
                    if not w.send(self._seq, keys[k][0], keys[k][1], now + self.startup_timeout_s):
                        pending.appendleft(k)  # the pipe broke: the worker is gone
                        self._replace(w)
            deadlines = [w.task.deadline for w in self._workers if w.task is not None]
            deadlines += [w.started + self.startup_timeout_s for w in self._workers if not w.ready]
            wait = max(0.0, min(deadlines) - now) if deadlines else 0.05
            by_fd = {w.fd: w for w in self._workers}
            readable, _, _ = select.select(list(by_fd), [], [], min(wait, 1.0))
            for fd in readable:
                w = by_fd[fd]
                msgs = w.read()
                if msgs is None:  # the worker died (segfault, OOM kill, killed from outside, ...)
                    if w.task is not None:
                        if w.task.acked:
                            results[local[w.task.req_id]] = None  # died judging it: the row scores 0
                        else:
                            undelivered(w)
                    elif not w.ready:
                        startup_failures += 1
                        if startup_failures >= 3:
                            tail = w.stderr_tail()
                            self._stop_workers()
                            raise RuntimeError(f"math-verify worker failed to start:\n{tail}")
                    self._replace(w)
                    continue
                for msg in msgs:
                    if msg.get("ready"):
                        w.ready = True
                    elif w.task is None:
                        continue
                    elif "ack" in msg and msg["ack"] == w.task.req_id:
                        w.task.acked = True
                        w.task.deadline = time.monotonic() + self.timeout_s  # the row's budget starts now
                    elif msg.get("id") == w.task.req_id:
                        results[local[w.task.req_id]] = None if msg.get("err") else bool(msg.get("ok"))
                        w.task = None
            now = time.monotonic()
            for w in list(self._workers):
                if w.task is not None and now >= w.task.deadline:
                    if w.task.acked:
                        results[local[w.task.req_id]] = None  # over budget: kill, replace, score 0
                    else:
                        undelivered(w)
                    self._replace(w)
                elif not w.ready and now >= w.started + self.startup_timeout_s:
                    tail = w.stderr_tail()
                    self._stop_workers()
                    raise RuntimeError(f"math-verify worker did not start within {self.startup_timeout_s}s:\n{tail}")
        return results

"""`results_in_time`: a step's rows scored concurrently, all within one wall-clock limit.

The limit bounds the step, not each row: every row must be scored within `timeout_s` of the start, so a step
takes at most about one limit whatever the number of rows that hang. The rows run in daemon worker threads
(`threads` of them at first, each taking the next row when it is done). A row that runs longer than
`stall_s` (a tenth of the limit, at most 1 s) lets one more worker start, so rows that hang do not keep the
others waiting (with `threads=1` the rows run one after another, and the rows after a hanging one fail).
Rows not scored by the limit fail with `TimeoutError`. Python cannot stop a thread: the workers still on a
row at the limit are abandoned, and an exception (`RowAbandoned`, not an `Exception`) is raised in them, which
ends a row looping in Python code at once and one blocked in a call (a `sleep`, a socket) when the call
returns. Rewards that judge untrusted programs or formulas (`rewards.code`, `rewards.math`) run
them in killable worker processes instead. Rows scored in workers do not run in the main thread: code that
installs signal handlers (`signal.alarm` time-outs) needs `timeout_s: null`, and a `score_row` that is not
thread-safe `threads=1` (`RewardCallback.concurrent_rows`).
"""

from __future__ import annotations

import ctypes
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

MAX_STALL_S = 1.0


def row_timeout(message: str) -> TimeoutError:
    """A `TimeoutError` for a row not scored within the step's limit, marked as one (`is_row_timeout`)."""
    error = TimeoutError(message)
    error.row_timeout = True
    return error


def is_row_timeout(error: object) -> bool:
    return isinstance(error, TimeoutError) and getattr(error, "row_timeout", False)


class RowAbandoned(BaseException):
    """Raised in a worker thread whose row ran past the limit; a BaseException, so `except Exception` in reward
    code does not keep the row going."""


def results_in_time(
    function: Callable[[int], Any], num_rows: int, timeout_s: float | None, what: str, threads: int = 1
) -> list[tuple[bool, Any]]:
    """`(True, function(i))` or `(False, the exception it raised)` for i = 0..num_rows-1, in order; a row not
    done `timeout_s` seconds after the start gives `(False, TimeoutError)` (`is_row_timeout`) naming `what` and
    the row. Any `BaseException` but `KeyboardInterrupt` (`SystemExit` included) is handed over, not raised.
    `threads`: the rows scored at the same time (more start when rows stall). `timeout_s=None`: no limit,
    every row in the caller's thread, one after another."""
    if timeout_s is None:
        results = []
        for i in range(num_rows):
            try:
                results.append((True, function(i)))
            except KeyboardInterrupt:
                raise
            except BaseException as error:  # handed to the caller
                results.append((False, error))
        return results
    return _Workers(function, num_rows, what, max(1, threads)).run(timeout_s)


class _Workers:
    """The worker threads of one call of `results_in_time`, and the rows they share."""

    def __init__(self, function: Callable[[int], Any], num_rows: int, what: str, threads: int) -> None:
        self.function, self.num_rows, self.what, self.threads = function, num_rows, what, threads
        self.lock = threading.Lock()
        self.next_row = 0
        self.stopped = False
        self.running: dict[threading.Thread, tuple[int, float]] = {}  # worker -> (row, started at)
        self.finished: queue.SimpleQueue = queue.SimpleQueue()  # (row, returned, value)

    def run(self, timeout_s: float) -> list[tuple[bool, Any]]:
        start = time.monotonic()
        deadline, stall_s = start + timeout_s, min(MAX_STALL_S, timeout_s / 10)
        results: list[tuple[bool, Any] | None] = [None] * self.num_rows
        done = 0
        for _ in range(min(self.threads, self.num_rows)):
            self._start_worker()
        while done < self.num_rows:
            now = time.monotonic()
            if now >= deadline:
                break
            try:
                row, returned, value = self.finished.get(timeout=min(deadline - now, stall_s))
            except queue.Empty:
                self._start_worker_if_stalled(stall_s)
                continue
            if isinstance(value, KeyboardInterrupt):
                self._abandon()
                raise value
            results[row], done = (returned, value), done + 1
            self._start_worker_if_stalled(stall_s)
        self._abandon()
        while True:  # rows finished while this thread waited for the interpreter (busy workers hold it)
            try:
                row, returned, value = self.finished.get_nowait()
            except queue.Empty:
                break
            if isinstance(value, KeyboardInterrupt):
                raise value
            results[row] = (returned, value)
        late = "{} row {} was not scored within timeout_s={:g} s of the step"
        return [
            result if result is not None else (False, row_timeout(late.format(self.what, i, timeout_s)))
            for i, result in enumerate(results)
        ]

    def _start_worker(self) -> None:
        worker = threading.Thread(target=self._score_rows, name=self.what.replace(" ", "-"), daemon=True)
        try:
            worker.start()
        except RuntimeError:  # no thread can be started (too many abandoned ones): the rows left wait
            pass

    def _start_worker_if_stalled(self, stall_s: float) -> None:
        """While rows are left, as many more workers as have been on their row longer than `stall_s`, so that
        `threads` keep moving (none with `threads=1`: a reward that is not thread-safe)."""
        if self.threads == 1:
            return
        now = time.monotonic()
        with self.lock:
            rows_left = self.num_rows - self.next_row
            moving = sum(now - started < stall_s for _, started in self.running.values())
            idle = max(self.threads - len(self.running), 0)
        for _ in range(min(rows_left, self.threads - moving - idle)):
            self._start_worker()

    def _score_rows(self) -> None:
        try:
            while True:
                with self.lock:
                    if self.stopped or self.next_row >= self.num_rows:
                        self.running.pop(threading.current_thread(), None)
                        return
                    row, self.next_row = self.next_row, self.next_row + 1
                    self.running[threading.current_thread()] = (row, time.monotonic())
                try:
                    self.finished.put((row, True, self.function(row)))
                except RowAbandoned:
                    return
                except BaseException as error:  # handed to the caller
                    self.finished.put((row, False, error))
        except RowAbandoned:  # raised between two rows
            return

    def _abandon(self) -> None:
        """No worker starts another row; the ones still on a row get `RowAbandoned`."""
        with self.lock:
            self.stopped = True
            stuck = [worker for worker in self.running if worker.is_alive()]
            self.running.clear()
        for worker in stuck:
            _raise_in(worker, RowAbandoned)


def _raise_in(thread: threading.Thread, kind: type[BaseException]) -> None:
    """Raise `kind` in `thread` at its next Python instruction (CPython's `PyThreadState_SetAsyncExc`)."""
    if thread.ident is not None and thread.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(kind))

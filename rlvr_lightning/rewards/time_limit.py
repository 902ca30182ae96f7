"""`results_in_time`: a reward's rows scored one by one, each within a wall-clock limit.

The rows run in order in one daemon worker thread, which hands each result over as soon as it is ready
(tens of microseconds a row, not a thread per row). A row that overruns fails with `TimeoutError`; Python
cannot stop a thread, so the worker is abandoned to that row (it keeps one core busy if the row never ends,
and does not hold the process's exit up) and a new worker takes the rows after it. Rewards that judge
untrusted programs or formulas (`rewards.code`, `rewards.math`) therefore run them in killable worker
processes instead. Rows scored in the worker do not run in the main thread: code that installs signal
handlers (`signal.alarm` time-outs) needs `timeout_s: null`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any


def results_in_time(
    function: Callable[[int], Any], num_rows: int, timeout_s: float | None, what: str
) -> Iterator[tuple[bool, Any]]:
    """`(True, function(i))` or `(False, the exception it raised)` for i = 0..num_rows-1, in order; a row that
    takes longer than `timeout_s` seconds gives `(False, TimeoutError)` naming `what` and the row. Any
    `BaseException` (`SystemExit` included) is handed over, not raised. `timeout_s=None`: no limit, every row
    in the caller's thread."""
    if timeout_s is None:
        for i in range(num_rows):
            try:
                yield True, function(i)
            except KeyboardInterrupt:
                raise
            except BaseException as error:  # handed to the caller
                yield False, error
        return
    start = 0
    while start < num_rows:
        results: queue.SimpleQueue = queue.SimpleQueue()
        stop = threading.Event()
        worker = threading.Thread(
            target=_score_rows,
            args=(function, start, num_rows, results, stop),
            name=what.replace(" ", "-"),
            daemon=True,
        )
        worker.start()
        try:
            for i in range(start, num_rows):
                try:
                    result = results.get(timeout=timeout_s)
                except queue.Empty:
                    yield False, TimeoutError(f"{what} row {i} took longer than timeout_s={timeout_s:g} s")
                    start = i + 1
                    break
                yield result
            else:
                start = num_rows
        finally:
            stop.set()  # an abandoned worker starts no further row


def _score_rows(function, start: int, stop_row: int, results: queue.SimpleQueue, stop: threading.Event) -> None:
    for i in range(start, stop_row):
        if stop.is_set():
            return
        try:
            results.put((True, function(i)))
        except BaseException as error:  # handed to the caller
            results.put((False, error))

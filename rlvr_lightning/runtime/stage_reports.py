"""Progress inside a training step, for whoever shows it.

A language-model step takes minutes on a CPU, and Lightning's progress bar moves only between
steps. The module reports each stage it enters (`report_stage("generate")`) and a generation loop
each decoding step (`report_tokens(done, total)`); listeners (the `rlvr` progress bar,
`callbacks/progress.py`) show them. With no listener, both calls return at once. A thread inside
`muted()` reports nothing (asynchronous rollouts generate in a background thread while the step
reports its own stages).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Protocol


class ProgressListener(Protocol):
    def on_stage(self, stage: str) -> None: ...

    def on_tokens(self, done: int, total: int) -> None: ...


_listeners: list[ProgressListener] = []
_this_thread = threading.local()


def report_stage(stage: str) -> None:
    """The step entered `stage` ("generate", "score", "log-probs", "update", ...)."""
    if getattr(_this_thread, "muted", False):
        return
    for listener in _listeners:
        listener.on_stage(stage)


def report_tokens(done: int, total: int) -> None:
    """A generation loop decoded `done` of at most `total` new tokens (call once per decoding step)."""
    if getattr(_this_thread, "muted", False):
        return
    for listener in _listeners:
        listener.on_tokens(done, total)


@contextmanager
def muted():
    """Nothing this thread reports reaches the listeners (other threads are not affected)."""
    before = getattr(_this_thread, "muted", False)
    _this_thread.muted = True
    try:
        yield
    finally:
        _this_thread.muted = before


def add_listener(listener: ProgressListener) -> None:
    if listener not in _listeners:
        _listeners.append(listener)


def remove_listener(listener: ProgressListener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


@contextmanager
def listening(listener: ProgressListener):
    add_listener(listener)
    try:
        yield listener
    finally:
        remove_listener(listener)

"""Progress inside a training step, for whoever shows it.

A language-model step takes minutes on a CPU, and Lightning's progress bar moves only between
steps. The module reports each stage it enters (`report_stage("generate")`) and a generation loop
each decoding step (`report_tokens(done, total)`); listeners (the `rlvr` progress bar,
`callbacks/progress.py`) show them. With no listener, both calls return at once.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Protocol


class ProgressListener(Protocol):
    def on_stage(self, stage: str) -> None: ...

    def on_tokens(self, done: int, total: int) -> None: ...


_listeners: list[ProgressListener] = []


def report_stage(stage: str) -> None:
    """The step entered `stage` ("generate", "score", "log-probs", "update", ...)."""
    for listener in _listeners:
        listener.on_stage(stage)


def report_tokens(done: int, total: int) -> None:
    """A generation loop decoded `done` of at most `total` new tokens (call once per decoding step)."""
    for listener in _listeners:
        listener.on_tokens(done, total)


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

"""A policy and a callback that record, for every rollout, which weights sampled it, in which thread, and the
thread's settings: shared by the tests of asynchronous rollouts."""

from __future__ import annotations

import ctypes
import threading
import time
from pathlib import Path

import lightning.pytorch as pl
import torch

from rlvr_lightning.policies.toy_sort import ToySortPolicy


def fingerprint(policy: torch.nn.Module) -> float:
    """A number that changes whenever an optimizer step changes the weights."""
    return float(sum(p.detach().double().sum() for p in policy.parameters()))


def openmp_threads() -> int | None:
    """This thread's OpenMP thread count as native kernels see it (torch's own query reads a global)."""
    maps = Path("/proc/self/maps")
    paths = (
        {line.split()[-1] for line in maps.read_text().splitlines() if "libgomp" in line} if maps.exists() else set()
    )
    return ctypes.CDLL(sorted(paths)[0]).omp_get_max_threads() if paths else None


class RecordingPolicy(ToySortPolicy):
    """Writes into every row which weights sampled it, and in which thread; while sampling beside an update
    (not in the main thread), it waits for that update's first optimizer step to happen (`overlap`)."""

    overlap: dict | None = None  # {"steps": [int], "launched_at": int}: set by the overlap test

    def sample(self, batch, n, sampling, generator=None):
        threads = openmp_threads()  # before any torch operation of this thread could set it lazily
        before = fingerprint(self)
        background = threading.current_thread() is not threading.main_thread()
        overlapped = None
        if background and self.overlap is not None:
            deadline = time.monotonic() + 20
            while self.overlap["steps"][0] <= self.overlap["launched_at"] and time.monotonic() < deadline:
                time.sleep(0.001)
            overlapped = self.overlap["steps"][0] > self.overlap["launched_at"]
        rollout = super().sample(batch, n, sampling, generator)
        record = {
            "sampled_with": before,
            "unchanged": fingerprint(self) == before,
            "background": background,
            "own_generator": generator is not None,
            "overlapped": overlapped,
            "threads": threads,
        }
        rollout.metadata = [{**m, **record} for m in rollout.metadata]
        return rollout


class WeightsAtStepStart(pl.Callback):
    """The live weights' fingerprint at the start of every step, and the trained rollout's records."""

    def __init__(self):
        self.at_start, self.trained = [], []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.at_start.append(fingerprint(pl_module.policy))
        pl_module.last_rollout = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        rollout = pl_module.last_rollout
        self.trained.append(None if rollout is None else rollout.metadata[0])


def recording_policy():
    torch.manual_seed(0)
    return RecordingPolicy(vocab_size=5, prompt_length=3, embedding_dim=4)

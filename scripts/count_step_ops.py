"""Noise-free companion of bench_overhead.py: what one training step does, counted rather than timed.

Counts, over rollout steps 20-69 of the lecture run, the aten operations (torch.profiler) and the
Python function calls (cProfile) per step of `rlvr fit --config configs/sort_lecture.yaml` and of
the bare-Lightning leg of bench_overhead.py (the plain loop's body in a bare Trainer; its tensor
work is the plain loop's). Counts do not depend on how busy the machine is, so they show what a
change to the step costs where timings on a shared machine cannot.

    python scripts/count_step_ops.py
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_overhead as bench  # noqa: E402

from rlvr_lightning.cli.app import main as rlvr_cli  # noqa: E402

FIRST, STEPS = 20, 50


class CountWindow(pl.Callback):
    """Counts `kind` ("aten" or "python") over training steps FIRST .. FIRST + STEPS - 1."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.profiler = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx == FIRST - 1:
            self.profiler = profile(activities=[ProfilerActivity.CPU]) if self.kind == "aten" else cProfile.Profile()
            self.profiler.__enter__() if self.kind == "aten" else self.profiler.enable()
        elif batch_idx == FIRST + STEPS - 1:
            self.profiler.__exit__(None, None, None) if self.kind == "aten" else self.profiler.disable()

    def per_step(self) -> float:
        if self.kind == "aten":
            return sum(1 for event in self.profiler.events() if event.name.startswith("aten::")) / STEPS
        return pstats.Stats(self.profiler).total_calls / STEPS


def count_rlvr_fit(kind: str) -> float:
    window = CountWindow(kind)
    cli = rlvr_cli(["--config", str(bench.CONFIG), f"--trainer.limit_train_batches={FIRST + STEPS}"], run=False)
    cli.trainer.callbacks.append(window)
    cli.trainer.fit(cli.model, cli.datamodule)
    return window.per_step()


def count_bare_lightning(kind: str) -> float:
    window = CountWindow(kind)
    trainer = pl.Trainer(
        max_epochs=1,
        limit_train_batches=FIRST + STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[window],
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(bench.BareLightningModule(), torch.utils.data.DataLoader(bench.RandomPrompts(), batch_size=None))
    return window.per_step()


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as run_dir:
        cwd = os.getcwd()
        os.chdir(run_dir)
        try:
            for kind, label in (("aten", "aten operations"), ("python", "Python function calls")):
                rows.append((label, count_bare_lightning(kind), count_rlvr_fit(kind)))
        finally:
            os.chdir(cwd)
    print(f"\nper training step (steps {FIRST}-{FIRST + STEPS - 1}):")
    for label, bare, fit in rows:
        print(f"  {label:22s} bare Lightning {bare:8.0f}   rlvr fit {fit:8.0f}   ratio {fit / bare:.2f}")


if __name__ == "__main__":
    main()

"""`SaveOnInterrupt`: Ctrl-C or a scheduler's SIGTERM saves a checkpoint the run resumes from exactly.

Lightning turns Ctrl-C into a `KeyboardInterrupt` wherever the program happens to be, in the middle of
a generation or between two mini-batch updates: no state there can be saved and resumed bit for bit.
This callback replaces the SIGINT and SIGTERM handlers while training runs (Lightning's SIGTERM
handler included, which would stop a validation half-way). The first signal only sets a flag; the
rollout step in progress finishes, and at its end, where `RolloutCheckpoint` saves too, `last.ckpt` is
written in the run's checkpoint directory and the run stops with exit status 128 + the signal
number (130 for SIGINT, 143 for SIGTERM). A second signal stops at once, without saving.

Under DDP the ranks agree at the end of every step (one all-reduce of a flag), so every rank stops
after the same step even when only one received the signal. SLURM: `#SBATCH --signal=TERM@120`
sends SIGTERM two minutes before the time limit; leave at least one step's time plus a save.
(Lightning's own SLURM auto-requeue on SIGUSR1 is left alone: it saves wherever the signal lands.)
"""

from __future__ import annotations

import os
import signal
import threading
import time

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info

from rlvr_lightning.runtime import stage_reports

SIGNALS = ("SIGINT", "SIGTERM")


class TrainingInterrupted(SystemExit):
    """Raised after the interrupt checkpoint is written; the process exits with 128 + the signal number."""

    def __init__(self, signum: int, checkpoint: str | None) -> None:
        super().__init__(128 + signum)
        self.signum = signum
        self.checkpoint = checkpoint


class SaveOnInterrupt(Callback):
    def __init__(self, signals: list[str] | None = None) -> None:
        """
        Args:
            signals: the signals that stop the run after a save (default SIGINT and SIGTERM).
        """
        names = list(SIGNALS if signals is None else signals)
        unknown = [name for name in names if not isinstance(getattr(signal, name, None), signal.Signals)]
        if unknown:
            raise ValueError(f"signals: {unknown} are not signal names of this platform; e.g. {list(SIGNALS)}")
        self.signals = [getattr(signal, name) for name in names]
        self.received: int | None = None  # the first signal received, pending until the step ends
        self._announced = False
        self._previous: dict[int, object] = {}

    # ---------------------------------------------------------------- signal handling

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.received, self._announced = None, False
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._handle)
        stage_reports.add_listener(self)

    def _handle(self, signum: int, frame) -> None:
        if self.received is not None:  # the second signal: stop now, without a checkpoint
            self._restore_handlers()
            raise KeyboardInterrupt
        self.received = signum

    def _restore_handlers(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
        stage_reports.remove_listener(self)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore_handlers()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._restore_handlers()

    # The module reports its stages and the generation loop its tokens: safe points to tell the user.
    def on_stage(self, stage: str) -> None:
        self._announce()

    def on_tokens(self, done: int, total: int) -> None:
        self._announce()

    def _announce(self) -> None:
        if self.received is not None and not self._announced:
            self._announced = True
            name = signal.Signals(self.received).name
            again = "Ctrl-C" if self.received == signal.SIGINT else name
            rank_zero_info(
                f"rlvr: {name} received: saving a checkpoint when this rollout step ends "
                f"({again} again stops now, without it)"
            )

    # ---------------------------------------------------------------- the save

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        received = self.received or 0
        if trainer.world_size > 1:  # every rank stops after the same step, if any rank was signalled
            flag = torch.tensor([received], device=trainer.strategy.root_device)
            received = int(trainer.strategy.reduce(flag, reduce_op="max").item())
        if not received:
            return
        self._announce()
        path = self.checkpoint_path(trainer)
        step = trainer.fit_loop.epoch_loop._batches_that_stepped + 1
        name = signal.Signals(received).name
        if path is None:
            rank_zero_info(f"rlvr: {name}: stopped after rollout step {step}; checkpointing is off, nothing was saved")
        else:
            started = time.monotonic()
            for callback in trainer.checkpoint_callbacks:  # so that the resumed run saves over this file, not beside it
                if isinstance(callback, ModelCheckpoint) and callback.save_last and callback.dirpath:
                    if os.path.dirname(path) == str(callback.dirpath):
                        callback.last_model_path = path
            trainer.save_checkpoint(path, weights_only=False)
            rank_zero_info(
                f"rlvr: {name}: saved {path} after rollout step {step} ({time.monotonic() - started:.1f} s); "
                f"resume with the same command and --ckpt_path last (or --ckpt_path {path})"
            )
        self._restore_handlers()
        raise TrainingInterrupted(received, path)

    @staticmethod
    def checkpoint_path(trainer: pl.Trainer) -> str | None:
        """`last.ckpt` in the directory of the run's first `ModelCheckpoint` (where `--ckpt_path last` looks)."""
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, ModelCheckpoint) and callback.dirpath:
                return os.path.join(callback.dirpath, callback.CHECKPOINT_NAME_LAST + callback.FILE_EXTENSION)
        return None

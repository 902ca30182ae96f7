"""`WriteEnvironment`: `environment.json` (`run_environment.environment_record`) in the run's log directory.

`rlvr fit` adds it, so a run's metrics always sit beside the versions, threads and machine that
produced them. Written by rank 0 when fit starts, into the trainer's `log_dir` and into the log
directory of every CSV or TensorBoard logger (the trainer's `log_dir` is the first logger's save
directory when that logger is W&B, shared by every run; a CSV logger's directory is this run's).
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from rlvr_lightning.runtime.run_environment import environment_record

FILENAME = "environment.json"


class WriteEnvironment(Callback):
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        log_dir = trainer.log_dir  # every rank: the property broadcasts rank 0's directory
        if not trainer.is_global_zero:
            return
        directories = [log_dir] + [
            logger.log_dir for logger in trainer.loggers if isinstance(logger, (CSVLogger, TensorBoardLogger))
        ]
        text = json.dumps(environment_record(), indent=1) + "\n"
        for directory in dict.fromkeys(d for d in directories if d):
            path = Path(directory)
            path.mkdir(parents=True, exist_ok=True)
            (path / FILENAME).write_text(text)

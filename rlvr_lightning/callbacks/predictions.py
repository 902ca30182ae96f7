"""`CompletionWriter`: what `rlvr predict` produces, one JSON line per completion.

Each line holds the prompt, the completion (text, or token ids for token-level policies), the total
reward and each reward by name, whether the task's reward calls it correct, whether it hit
`max_new_tokens`, and the example's metadata (ground truth, ...). Lines are written as each batch
finishes, so an interrupted run keeps what it did. Under DDP each rank writes its own file
(`predictions.rank1.jsonl`, ...).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.utilities import rank_zero_info


class CompletionWriter(BasePredictionWriter):
    def __init__(self, path: str = "predictions.jsonl") -> None:
        super().__init__(write_interval="batch")
        self.path = path
        self.rows = 0
        self._file = None

    def rank_path(self, trainer: pl.Trainer) -> Path:
        path = Path(self.path)
        return path if trainer.global_rank == 0 else path.with_suffix(f".rank{trainer.global_rank}{path.suffix}")

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        path = self.rank_path(trainer)
        os.makedirs(path.parent, exist_ok=True)
        self._file = open(path, "w", encoding="utf-8")
        self.rows = 0

    def write_on_batch_end(
        self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx
    ) -> None:
        for row in prediction:
            self._file.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        self._file.flush()
        self.rows += len(prediction)

    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close()
        rank_zero_info(f"rlvr: wrote {self.rows} completions to {self.rank_path(trainer)}")

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._close()

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

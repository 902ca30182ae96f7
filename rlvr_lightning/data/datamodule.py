"""`RLVRDataModule`: batches of prompts from a `Task` for training and validation."""

from __future__ import annotations

import lightning.pytorch as pl
from torch.utils.data import DataLoader, IterableDataset

from rlvr_lightning.data.task import Task, collate_examples


class RLVRDataModule(pl.LightningDataModule):
    def __init__(self, task: Task, batch_size: int = 16, val_batch_size: int | None = None, num_workers: int = 0):
        """`batch_size` counts prompts; each is sampled `group_size` times by the module."""
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"data.batch_size must be >= 1, got {batch_size}")
        self.task = task
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size or batch_size
        self.num_workers = num_workers

    # The seam for the best-of-n difficulty filter: it replaces the training prompts.
    def train_prompts(self):
        return self.task.train_dataset()

    def train_dataloader(self) -> DataLoader:
        dataset = self.train_prompts()
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=not isinstance(dataset, IterableDataset),
            drop_last=True,
            collate_fn=collate_examples,
            num_workers=self.num_workers,
        )

    def val_dataloader(self) -> DataLoader | list:
        dataset = self.task.val_dataset()
        if dataset is None:
            return []
        return DataLoader(
            dataset, batch_size=self.val_batch_size, collate_fn=collate_examples, num_workers=self.num_workers
        )

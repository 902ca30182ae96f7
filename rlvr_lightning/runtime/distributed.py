"""Metrics across ranks: one `all_gather` reduces a vector of metrics by each one's name, and the
trainer's loggers receive the floats.

A metric is reduced by its name: `*_min` by the minimum, `*_max` by the maximum, everything else
by the mean; `reduce_ops` overrides that per key ("mean", "min", "max", "sum").
"""

from __future__ import annotations

from collections.abc import Mapping

import lightning.pytorch as pl
import torch
from torch import Tensor

REDUCE_OPS = ("mean", "min", "max", "sum")


def reduce_op_for(name: str, reduce_ops: Mapping[str, str] | None = None) -> str:
    """The cross-rank reduction of metric `name`: `reduce_ops[name]`, else by suffix (`_min`, `_max`), else mean."""
    if reduce_ops and name in reduce_ops:
        op = reduce_ops[name]
        if op not in REDUCE_OPS:
            raise ValueError(f"reduce op {op!r} for metric {name!r} is not one of {REDUCE_OPS}")
        return op
    if name.endswith("_min"):
        return "min"
    if name.endswith("_max"):
        return "max"
    return "mean"


def all_gather(trainer: pl.Trainer, tensor: Tensor) -> Tensor:
    """`[world_size, *tensor.shape]`: every rank's `tensor` (torch.distributed directly when it is up, which
    avoids the deprecated functional collective Lightning's `strategy.all_gather` goes through)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        parts = [torch.empty_like(tensor) for _ in range(torch.distributed.get_world_size())]
        torch.distributed.all_gather(parts, tensor.contiguous())
        return torch.stack(parts)
    return trainer.strategy.all_gather(tensor).reshape(-1, *tensor.shape)


def reduce_across_ranks(
    trainer: pl.Trainer, values: Tensor, names: list[str], reduce_ops: Mapping[str, str] | None = None
) -> Tensor:
    """`values[i]` (metric `names[i]`) reduced over all ranks, with one `all_gather`. Identity on one process."""
    if trainer.world_size <= 1:
        return values
    gathered = all_gather(trainer, values)  # [world_size, K]
    ops = [reduce_op_for(name, reduce_ops) for name in names]
    if all(op == "mean" for op in ops):
        return gathered.mean(0)
    by_op = {
        "mean": gathered.mean(0),
        "min": gathered.min(0).values,
        "max": gathered.max(0).values,
        "sum": gathered.sum(0),
    }
    return torch.stack([by_op[op][i] for i, op in enumerate(ops)])


def log_to_loggers(trainer: pl.Trainer, metrics: Mapping[str, float], step: int) -> None:
    """Send floats straight to every logger of the trainer (loggers write on rank 0 only)."""
    for logger in trainer.loggers:
        logger.log_metrics(dict(metrics), step=step)

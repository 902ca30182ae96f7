"""Gradients in the training modules: the total norm they log (and the RL module checks for finiteness),
and which backward passes synchronise them across ranks."""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager, nullcontext

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import ParallelStrategy
from torch import Tensor

log = logging.getLogger(__name__)


def total_norm(grads: list[Tensor], device: torch.device | None = None) -> Tensor:
    """The 2-norm of all gradients together: `torch.nn.utils.get_total_norm`, without its grouping by device
    and dtype when there is one group (the usual case; 12 instead of 28 us per call on the toy task).

    On `device` when given (the loss's: it is checked and logged beside the loss, and offloaded gradients are
    CPU tensors), else where the gradients are (CPU when there are none)."""
    if not grads:
        return torch.zeros((), device=device)
    if _is_sharded(grads[0]):  # FSDP2: each rank holds a shard; torch's norm of DTensors reduces across ranks
        norm = torch.nn.utils.get_total_norm(grads).full_tensor()
    elif len({(g.device, g.dtype) for g in grads}) > 1 or any(g.is_sparse for g in grads):
        norm = torch.nn.utils.get_total_norm(grads)
    else:
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    return norm if device is None else norm.to(device)


def _is_sharded(tensor: Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def policy_gradient_norm(module: torch.nn.Module, device: torch.device | None = None) -> Tensor:
    """`total_norm` of the gradients `module`'s parameters hold, on `device` when given."""
    return total_norm([p.grad for p in module.parameters() if p.grad is not None], device)


def non_finite_gradients(module: torch.nn.Module, limit: int = 3) -> tuple[list[str], int]:
    """The names of the first `limit` parameters whose gradient (this rank's shard under FSDP2) holds a NaN or an
    infinity, and how many such parameters there are: where a skipped update's non-finite gradient comes from."""
    names = [
        name
        for name, p in module.named_parameters()
        if p.grad is not None and not bool(torch.isfinite(getattr(p.grad, "_local_tensor", p.grad)).all())
    ]
    return names[:limit], len(names)


def report_skipped_update(module: torch.nn.Module, loss: float, grad_norm: float, in_a_row: int, limit: int) -> None:
    """Warn that an update with a non-finite loss or gradient was skipped, naming the parameters whose gradient is not
    finite (read them before zeroing); raise once `limit` updates in a row were skipped."""
    names, count = non_finite_gradients(module)
    where = f"; non-finite gradients in {count} parameters, first {', '.join(names)}" if count else ""
    log.warning(
        "non-finite loss or gradient (loss %s, gradient norm %s): update skipped (%d in a row)%s",
        loss, grad_norm, in_a_row, where,
    )  # fmt: skip
    if in_a_row >= limit:
        raise RuntimeError(
            f"{in_a_row} consecutive updates had a non-finite loss or gradient "
            f"(update.max_consecutive_skips={limit}); stopping. Lower the "
            "learning rate, check the rewards for NaN, or raise update.max_consecutive_skips."
        )


def backward_sync(module: pl.LightningModule, sync: bool) -> AbstractContextManager:
    """Around a `manual_backward`: with `sync` False (every micro-batch of a mini-batch but the last), DDP keeps
    this backward's gradients local and the last one all-reduces them all, once per optimizer step
    (Lightning's `block_backward_sync`, DDP's `no_sync`). Nothing to do without DDP."""
    strategy = module.trainer.strategy
    if sync or not isinstance(strategy, ParallelStrategy):
        return nullcontext()
    return strategy.block_backward_sync()

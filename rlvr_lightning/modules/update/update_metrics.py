"""What a micro-batch's loss carries besides the scalar (`MicroBatchLoss`), and the step's update statistics
computed once from all of them (`update_metrics`)."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from rlvr_lightning.core.importance_sampling import mismatch_stats
from rlvr_lightning.core.losses.policy_losses import PolicyLossOutput, merged_stats
from rlvr_lightning.core.masked import join_masked, masked_mean


class MicroBatchLoss(NamedTuple):
    loss: Tensor  # the scalar that is back-propagated
    policy_loss: PolicyLossOutput
    mask: Tensor | None  # bool [n, T], None: every token counts
    kl: Tensor | None  # detached per-token KL, when it is in the loss
    entropy: Tensor | None  # detached per-token entropy, first epoch only
    sampler_pair: tuple[Tensor, Tensor] | None  # (trainer, sampler) log-probs at the sampling weights, first update
    # (detached per-token reverse KL to the teacher at the sampling policy, the tokens it teaches), first epoch
    teacher_kl: tuple[Tensor, Tensor | None] | None = None
    positive_nll: tuple[Tensor, Tensor] | None = (
        None  # (NLL sum, count) over the correct responses' tokens, first epoch
    )


@torch.no_grad()
def update_metrics(
    parts: list[MicroBatchLoss],
    losses: list[float],
    grad_norms: list[float],
    rollout_is_max: float,
    teacher_rows: Tensor | None = None,
) -> dict[str, Tensor | float]:
    """The step's update statistics, each computed once over all of its micro-batches (token-weighted);
    `rollout_is_max` is the importance weights' cap the mismatch statistics count against; `teacher_rows` the rows
    a `SelfTeacher` taught (bool[N]; None: a teacher teaches every row, or there is none)."""
    metrics = {f"train/{key}": value for key, value in merged_stats([part.policy_loss for part in parts]).items()}
    for name in ("kl", "entropy"):
        with_values = [part for part in parts if getattr(part, name) is not None]
        if with_values:
            values, mask = join_masked([getattr(part, name) for part in with_values], [p.mask for p in with_values])
            metrics[f"train/{name}"] = masked_mean(values, mask)
    taught = [part.teacher_kl for part in parts if part.teacher_kl is not None]
    if taught:  # over the tokens the teacher teaches (0 when it teaches none)
        metrics["train/teacher_kl"] = masked_mean(*join_masked([kl for kl, _ in taught], [m for _, m in taught]))
    if teacher_rows is not None:
        metrics["train/taught_rows"] = teacher_rows.float().mean()
    with_sampler = [part for part in parts if part.sampler_pair is not None]
    if with_sampler:
        masks = [part.mask for part in with_sampler]
        trainer, mask = join_masked([part.sampler_pair[0] for part in with_sampler], masks)
        sampler, _ = join_masked([part.sampler_pair[1] for part in with_sampler], masks)
        stats = mismatch_stats(trainer, sampler, mask, rollout_is_max)
        metrics.update({f"train/mismatch/{key}": value for key, value in stats.items()})
    with_nll = [part.positive_nll for part in parts if part.positive_nll is not None]
    if with_nll:
        total, count = sum(n for n, _ in with_nll), sum(c for _, c in with_nll)
        metrics["train/positive_nll"] = torch.where(count > 0, total / count.clamp(min=1), math.nan)  # NaN: none
    metrics["train/loss"] = sum(losses) / len(losses)
    metrics["train/grad_norm"] = sum(grad_norms) / len(grad_norms)
    return metrics

"""The critic's per-token regression loss for PPO, with optional clipping of the value update.

    loss_t = 1/2 * max((V_t - R_t)^2, (clip(V_t, V_old_t - c, V_old_t + c) - R_t)^2)

``V_t`` are the values being trained, ``V_old_t`` the critic's values when the rollout was scored
and ``R_t`` the GAE returns. The loss is ``[N, T]``, exactly 0 where ``mask == 0`` and not
aggregated (``aggregation.aggregate_loss`` does that; verl aggregates with ``token-mean``).
``clip_range=None`` is the plain squared error.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from rlvr_lightning.core.masked import masked_var


class ValueLossOutput(NamedTuple):
    loss: Tensor  # [N, T], 0 where mask == 0
    clipped: Tensor  # bool [N, T]: the clipped term was the larger one (verl's vf_clipfrac counts these)


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor | None, clip_range: float | None = None
) -> ValueLossOutput:
    """Per-token clipped value loss (see the module docstring)."""
    if (
        values.shape != returns.shape
        or values.shape != old_values.shape
        or (mask is not None and mask.shape != values.shape)
    ):
        raise ValueError(
            f"values, old_values, returns and mask must have one shape, got {tuple(values.shape)}, "
            f"{tuple(old_values.shape)}, {tuple(returns.shape)} and {None if mask is None else tuple(mask.shape)}"
        )
    if clip_range is not None and clip_range <= 0:
        raise ValueError(f"clip_range must be > 0 (or None: no clipping), got {clip_range}")
    returns, old_values = returns.detach(), old_values.detach()
    unclipped = (values - returns) ** 2
    if clip_range is None:
        loss, clipped = unclipped, torch.zeros_like(unclipped, dtype=torch.bool)
    else:
        moved = old_values + (values - old_values).clamp(-clip_range, clip_range)
        clipped_loss = (moved - returns) ** 2
        # max of the two squared errors  (verl core_algos.compute_value_loss; TRL PPOTrainer vf_losses1/2)
        loss = torch.maximum(unclipped, clipped_loss)
        clipped = clipped_loss > unclipped
    loss = 0.5 * loss
    if mask is not None:
        m = mask.bool()
        loss = torch.where(m, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))
        clipped = clipped & m
    return ValueLossOutput(loss, clipped)


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor | None) -> Tensor:
    """``1 - Var(R - V) / Var(R)`` over the masked tokens: 1 for a perfect critic, 0 for a constant one
    (verl ``critic/vf_explained_var``); 0 when the returns do not vary."""
    returns_var = masked_var(returns, mask, unbiased=False)
    residual_var = masked_var(returns - values, mask, unbiased=False)
    # 1 - Var[R - V] / Var[R]  (verl trainer/ppo/metric_utils: critic/vf_explained_var)
    explained = 1.0 - residual_var / returns_var.clamp(min=torch.finfo(returns_var.dtype).tiny)
    return torch.where(returns_var > 0, explained, torch.zeros_like(explained))

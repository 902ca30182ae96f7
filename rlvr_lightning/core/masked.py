"""Masked reductions over token tensors.

Token-level tensors are ``[N, T]`` with a ``mask`` of the same shape (1 = real
response token, 0 = prompt/padding). Every reduction here ignores the values
where ``mask == 0`` entirely (even NaN/inf there cannot leak in), and an
all-zero mask yields 0 instead of NaN. ``mask=None`` means every entry counts
(fixed-length responses): the plain reduction, without the masking ops.

Reference: verl ``verl/utils/torch_functional.py`` (masked_sum, masked_mean,
masked_var, masked_whiten), adapted to be NaN-free on empty masks.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _zero_where_masked(values: Tensor, mask: Tensor | None) -> Tensor:
    """``values`` with masked-out entries replaced by exact zeros."""
    if mask is None:
        return values
    return torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))


def join_masked(values: list[Tensor], masks: list[Tensor | None]) -> tuple[Tensor, Tensor | None]:
    """Several (values, mask) pairs (e.g. micro-batches) flattened into one: the mask is None only when all are."""
    flat = values[0].reshape(-1) if len(values) == 1 else torch.cat([v.reshape(-1) for v in values])
    if all(m is None for m in masks):
        return flat, None
    joined = [
        torch.ones_like(v, dtype=torch.bool) if m is None else m.bool() for v, m in zip(values, masks, strict=True)
    ]
    return flat, torch.cat([m.reshape(-1) for m in joined])


def masked_sum(values: Tensor, mask: Tensor | None, dim: int | None = None) -> Tensor:
    """Sum of ``values`` over entries where ``mask`` is non-zero.

    ``dim=None`` sums over all elements and returns a scalar.
    """
    # sum_t v_t * m_t  (verl torch_functional.masked_sum)
    kept = _zero_where_masked(values, mask)
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor | None, dim: int | None = None) -> Tensor:
    """Mean of ``values`` over entries where ``mask`` is non-zero.

    The denominator is clamped to at least 1, so an all-zero mask gives 0.
    """
    if mask is None:
        count = values.numel() if dim is None else values.shape[dim]
        return masked_sum(values, None, dim) / max(count, 1)
    # sum(v*m) / max(sum(m), 1)  (verl torch_functional.masked_mean, NaN-free)
    count = mask.to(values.dtype)
    count = count.sum() if dim is None else count.sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def masked_var(values: Tensor, mask: Tensor | None, unbiased: bool = True) -> Tensor:
    """Variance of the masked entries (over all elements), as a scalar.

    ``unbiased=True`` divides by ``n - 1`` (Bessel). With fewer than two
    masked entries (one for ``unbiased=False``) the result is 0, not NaN.
    """
    mean = masked_mean(values, mask)
    n = values.new_tensor(float(values.numel())) if mask is None else mask.to(values.dtype).sum()
    # sum(m * (v - mean)^2) / (n - 1)  (verl torch_functional.masked_var)
    sq_dev = masked_sum((values - mean) ** 2, mask)
    denom = (n - 1) if unbiased else n
    return sq_dev / denom.clamp(min=1)


def masked_normalize(values: Tensor, mask: Tensor | None, eps: float = 1e-8, shift_mean: bool = True) -> Tensor:
    """Whiten ``values`` using the mean and (unbiased) variance of the masked entries.

    Returns ``(v - mean) / sqrt(var + eps)``; with ``shift_mean=False`` the
    mean is added back (scale only). Entries where ``mask == 0`` are 0.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask, unbiased=True)
    # (v - mean) * rsqrt(var + eps) [+ mean]  (verl torch_functional.masked_whiten)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return _zero_where_masked(whitened, mask)

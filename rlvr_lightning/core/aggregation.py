"""Reduce a per-token loss ``[N, T]`` to the scalar that is back-propagated.

The normalisers ``num_sequences`` / ``num_tokens`` default to this call's own
batch (``N`` rows, ``mask.sum()`` tokens). For gradient accumulation pass the
totals of the WHOLE mini-batch to every micro-batch call: the micro losses then
SUM to exactly the loss (and gradient) of the unsplit mini-batch. (Pass
``num_sequences`` / ``num_tokens`` as python numbers or tensors.) The prompt-level mode
reads each row's prompt group (``group_index``); for gradient accumulation pass the
mini-batch's ``group_tokens`` (each row's group's tokens, ``group_token_table``) and
``num_groups`` in the same way; the length-weighted mode ``delta-l`` reads the mini-batch's
``length_power_sum`` (``length_powers(...).sum()`` over its rows).

Rows whose mask is all zero contribute 0 (never NaN), but still count in the
default ``num_sequences``; ``count_empty_rows=False`` counts only rows with at least one
token (verl's ``agg_loss``). ``mask=None`` means every token counts.
"""

from __future__ import annotations

import torch
from torch import Tensor

AGGREGATION_MODES = (
    "seq-mean-token-mean",
    "token-mean",
    "seq-mean-token-sum",
    "seq-sum-constant",
    "prompt-mean-token-mean",
    "delta-l",
)
PROMPT_MODE = "prompt-mean-token-mean"
DELTA_L_MODE = "delta-l"


def aggregate_loss(
    loss: Tensor,
    mask: Tensor | None,
    mode: str,
    num_sequences: int | float | Tensor | None = None,
    num_tokens: int | float | Tensor | None = None,
    constant: float | None = None,
    count_empty_rows: bool = True,
    group_index: Tensor | None = None,
    group_tokens: Tensor | None = None,
    num_groups: int | Tensor | None = None,
    alpha: float = 0.75,
    length_power_sum: Tensor | None = None,
) -> Tensor:
    """Scalar loss from per-token ``loss`` under ``mask`` (see ``AGGREGATION_MODES``).

    * "seq-mean-token-mean": mean over sequences of each sequence's token mean (GRPO).
    * "token-mean": every token of the (mini-)batch weighs the same (DAPO).
    * "seq-mean-token-sum": mean over sequences of each sequence's token sum.
    * "seq-sum-constant": token sums divided by a fixed ``constant`` (e.g.
      max_new_tokens), then mean over sequences (Dr. GRPO): no length bias.
    * "prompt-mean-token-mean": mean over prompts of the token mean over all the responses of each
      prompt (ScaleRL's prompt-level average): every prompt weighs the same, and within a
      prompt every token. Needs ``group_index`` ``[N]`` (or ``group_tokens`` and ``num_groups``).
    * "delta-l": each response's token sum weighted by ``|o_i|^-alpha`` over the batch's sum of those powers,
      divided by ``constant`` (He et al. 2025, ΔL Normalization): unbiased, and of least variance at
      ``alpha = 1``; ``alpha = 0`` is seq-sum-constant over the rows with tokens (``count_empty_rows=False``).
    """
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; valid choices: {', '.join(AGGREGATION_MODES)}")
    if loss.dim() != 2 or (mask is not None and mask.shape != loss.shape):
        mask_shape = None if mask is None else tuple(mask.shape)
        raise ValueError(f"loss and mask must both be [N, T], got {tuple(loss.shape)} and {mask_shape}")
    if mask is None:
        per_token, token_counts = loss, loss.shape[1]
        if num_tokens is None:
            num_tokens = loss.numel()
    else:
        m = mask.bool()
        per_token = torch.where(m, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))
        token_counts = m.sum(dim=-1).to(loss.dtype)  # [N]
        if num_tokens is None:
            num_tokens = token_counts.sum()
    if num_sequences is None:
        num_sequences = loss.shape[0] if count_empty_rows or mask is None else non_empty_rows(mask)

    if mode == PROMPT_MODE:
        if group_tokens is None or num_groups is None:
            if group_index is None:
                raise ValueError(f"mode {PROMPT_MODE!r} needs each row's group_index (or group_tokens and num_groups)")
            counts = token_counts if isinstance(token_counts, Tensor) else loss.new_full(loss.shape[:1], token_counts)
            table, groups = group_token_table(counts, group_index, count_empty_groups=count_empty_rows)
            group_tokens = table[group_index] if group_tokens is None else group_tokens
            num_groups = groups if num_groups is None else num_groups
        # 1/|P| sum_p 1/sum_{i in p} |o_i| sum_{i in p} sum_t l_it  (Khatri et al. 2025, ScaleRL §3.2 prompt average)
        row_sums = per_token.sum(dim=-1) / _clamp_count(group_tokens)
        return row_sums.sum() / _clamp_count(num_groups)
    if mode == DELTA_L_MODE:
        _check_constant(mode, constant)
        counts = token_counts if isinstance(token_counts, Tensor) else loss.new_full(loss.shape[:1], token_counts)
        powers = length_powers(counts, alpha)
        total = powers.sum() if length_power_sum is None else length_power_sum
        # 1/M sum_i |o_i|^-a / sum_j |o_j|^-a sum_t l_it  (He et al. 2025, arXiv:2509.07558, ΔL Normalization;
        # zerolllin/Delta-L-Normalization core_algos: scores * L^-a / mean(L^-a), then masked_mean_allavg over B x M)
        return (powers * per_token.sum(dim=-1)).sum() / _nonzero(total) / constant
    if mode == "seq-mean-token-mean":
        # 1/G sum_i 1/|o_i| sum_t l_it  (GRPO, Shao et al. 2024 DeepSeekMath eq. 3; verl core_algos.agg_loss)
        seq_means = per_token.sum(dim=-1) / _clamp_count(token_counts)
        return seq_means.sum() / _positive("num_sequences", num_sequences)
    if mode == "token-mean":
        # 1/sum_i |o_i| sum_i sum_t l_it  (DAPO, Yu et al. 2025 eq. 8 / §3.3 token-level loss; verl core_algos.agg_loss)
        return per_token.sum() / _clamp_count(num_tokens)
    if mode == "seq-mean-token-sum":
        # 1/G sum_i sum_t l_it  (verl core_algos.agg_loss "seq-mean-token-sum")
        return per_token.sum() / _positive("num_sequences", num_sequences)
    # mode == "seq-sum-constant"
    _check_constant(mode, constant)
    # 1/G sum_i (sum_t l_it) / C
    # (Dr. GRPO, Liu et al. 2025 "Understanding R1-Zero-Like Training", §3.1: constant instead of |o_i|)
    return per_token.sum() / constant / _positive("num_sequences", num_sequences)


def group_token_table(
    token_counts: Tensor, group_index: Tensor, num_slots: int | None = None, count_empty_groups: bool = True
) -> tuple[Tensor, Tensor]:
    """The tokens of each prompt group, indexed by ``group_index`` (``[num_slots]``, 0 for an absent group), and
    the number of groups among the rows (only those with a token unless ``count_empty_groups``; at least 1).

    ``token_counts`` ``[N]``: each row's tokens; ``num_slots`` bounds ``group_index`` (by default its maximum
    plus one, a host read)."""
    if num_slots is None:
        num_slots = int(group_index.max()) + 1 if group_index.numel() else 0
    counts = token_counts.to(torch.get_default_dtype())
    tokens = counts.new_zeros(num_slots).index_add_(0, group_index, counts)
    present = counts.new_zeros(num_slots).index_add_(0, group_index, torch.ones_like(counts)) > 0
    groups = (present if count_empty_groups else tokens > 0).sum().clamp(min=1)
    return tokens, groups


def length_powers(token_counts: Tensor, alpha: float) -> Tensor:
    """``|o_i|^-alpha`` for each row's token count ``[N]``, 0 for a row without tokens (delta-l's row weights, before
    they are divided by their sum over the mini-batch)."""
    counts = token_counts.to(torch.get_default_dtype()) if not token_counts.is_floating_point() else token_counts
    return torch.where(counts > 0, counts.clamp(min=1) ** -alpha, torch.zeros_like(counts))


def non_empty_rows(mask: Tensor) -> Tensor:
    """Rows with at least one token, at least 1 (an all-empty batch then has loss 0, not NaN)."""
    # only rows with tokens count in the sequence mean  (verl core_algos.agg_loss: seq_mask = sum(mask, -1) > 0)
    return (mask.sum(dim=-1) > 0).sum().clamp(min=1)


def _positive(name: str, value: int | float | Tensor) -> int | float | Tensor:
    if not isinstance(value, Tensor) and value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value


def _check_constant(mode: str, constant: float | None) -> None:
    if constant is None or constant <= 0:
        raise ValueError(f"mode {mode!r} needs a constant > 0 (e.g. max_new_tokens), got {constant!r}")


def _nonzero(value: Tensor) -> Tensor:
    """A sum of 0 (no row with a token: every term is 0 too) becomes 1, so the loss is 0 instead of NaN."""
    return torch.where(value > 0, value, torch.ones_like(value))


def _clamp_count(value: int | float | Tensor) -> int | float | Tensor:
    """A token count of 0 becomes 1, so an empty batch gives loss 0 instead of NaN."""
    return value.clamp(min=1) if isinstance(value, Tensor) else max(value, 1)


def token_weights(
    mask: Tensor,
    mode: str,
    num_sequences: int | float | Tensor | None = None,
    constant: float | None = None,
    count_empty_rows: bool = True,
    group_index: Tensor | None = None,
    alpha: float = 0.75,
) -> Tensor:
    """``[N]``: the weight ``aggregate_loss`` gives each token of row ``i``, i.e. ``d loss / d loss_it``.

    The weight depends on the row only through its length ``|o_i|``: ``1 / (G |o_i|)`` for
    seq-mean-token-mean (a token of a long response counts less: Dr. GRPO's length bias),
    ``1 / sum_j |o_j|`` for token-mean, ``1 / G`` for seq-mean-token-sum and ``1 / (G C)`` for
    seq-sum-constant, ``1 / (P sum_{j in p(i)} |o_j|)`` for prompt-mean-token-mean (``group_index``: each
    row's prompt) and ``|o_i|^-alpha / (C sum_j |o_j|^-alpha)`` for delta-l. Rows without tokens get 0.
    """
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; valid choices: {', '.join(AGGREGATION_MODES)}")
    m = mask.bool()
    lengths = m.sum(dim=-1).to(torch.get_default_dtype())
    if num_sequences is None:
        num_sequences = m.shape[0] if count_empty_rows else non_empty_rows(m)
    has_tokens = lengths > 0
    if mode == "seq-mean-token-mean":
        # d/dl_it [1/G sum_i 1/|o_i| sum_t l_it] = 1 / (G |o_i|)
        # (Liu et al. 2025, Dr. GRPO §3.1 "response-level length bias")
        weights = 1.0 / (lengths.clamp(min=1) * num_sequences)
    elif mode == "token-mean":
        weights = torch.full_like(lengths, 1.0) / lengths.sum().clamp(min=1)
    elif mode == PROMPT_MODE:
        if group_index is None:
            raise ValueError(f"mode {PROMPT_MODE!r} needs each row's group_index")
        table, groups = group_token_table(lengths, group_index, count_empty_groups=count_empty_rows)
        # d/dl_it [1/P sum_p 1/T_p sum_{i in p} sum_t l_it] = 1 / (P T_p(i))
        weights = 1.0 / (table[group_index].clamp(min=1) * groups)
    elif mode == "seq-mean-token-sum":
        weights = torch.full_like(lengths, 1.0) / num_sequences
    elif mode == DELTA_L_MODE:
        _check_constant(mode, constant)
        powers = length_powers(lengths, alpha)
        weights = powers / (_nonzero(powers.sum()) * constant)
    else:
        _check_constant(mode, constant)
        weights = torch.full_like(lengths, 1.0) / (constant * num_sequences)
    return torch.where(has_tokens, weights, torch.zeros_like(weights))

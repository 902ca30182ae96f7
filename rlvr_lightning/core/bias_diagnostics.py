"""Diagnostics of GRPO's two biases (Liu et al. 2025, "Understanding R1-Zero-Like Training", Dr. GRPO §3.1).

* Response-level length bias: the seq-mean-token-mean loss divides each response's token sum by its
  length, so a token of a long response weighs less than a token of a short one. Correct short
  responses get the largest push up, incorrect long ones the smallest push down, and incorrect
  responses grow longer. Seen in the mean length of correct and of incorrect responses and in the
  per-token weight the aggregation gives long versus short responses.
* Question-level difficulty bias: dividing by the group's reward std weighs questions whose rewards
  barely vary (nearly all right or all wrong) the most. Seen in the spread of the per-group std.

Pure tensor functions (no Lightning); every value is a 0-dim tensor, NaN where the step has no
row to average (e.g. no correct response).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr_lightning.core.aggregation import token_weights

STD_QUANTILES = (0.1, 0.5, 0.9)


def length_by_correctness(response_mask: Tensor, correct: Tensor) -> dict[str, Tensor]:
    """Mean response length (tokens) of the correct and of the incorrect responses (NaN when there are none)."""
    lengths = response_mask.bool().sum(dim=-1).to(torch.get_default_dtype())
    correct = correct.bool()
    nan = lengths.new_full((), float("nan"))

    def mean(rows: Tensor) -> Tensor:
        count = rows.sum()
        return torch.where(count > 0, (lengths * rows).sum() / count.clamp(min=1), nan)

    return {"length_correct": mean(correct), "length_incorrect": mean(~correct)}


def group_std_quantiles(
    rewards: Tensor, group_size: int, quantiles: tuple[float, ...] = STD_QUANTILES
) -> dict[str, Tensor]:
    """Quantiles of the per-group (unbiased) reward std, GRPO's advantage divisor: ``group_reward_std_q10`` etc."""
    if group_size < 2 or rewards.numel() % group_size:
        raise ValueError(f"group_size must be >= 2 and divide the {rewards.numel()} rewards, got {group_size}")
    stds = rewards.float().view(-1, group_size).std(dim=1, unbiased=True)
    values = torch.quantile(stds, torch.tensor(quantiles, dtype=stds.dtype, device=stds.device))
    return {
        f"group_reward_std_q{round(q * 100):02d}": value for q, value in zip(quantiles, values.unbind(), strict=True)
    }


def long_short_token_weights(
    response_mask: Tensor,
    mode: str,
    constant: float | None = None,
    count_empty_rows: bool = True,
    group_index: Tensor | None = None,
    alpha: float = 0.75,
) -> dict[str, Tensor]:
    """The per-token weight ``mode`` gives the longer and the shorter half of the responses.

    Weights are relative to token-mean's (every token of the batch weighs the same: 1), averaged over
    the rows of each half (rows sorted by length); ``token_weight_long_over_short`` is their ratio:
    1 without length bias, below 1 where a long response's tokens count less (seq-mean-token-mean).
    ``group_index``: each row's prompt (prompt-mean-token-mean); ``alpha``: delta-l's exponent.
    """
    num_rows = response_mask.shape[0]
    if num_rows < 2:
        raise ValueError(f"long and short halves need at least 2 responses, got {num_rows}")
    weights = token_weights(
        response_mask, mode, constant=constant, count_empty_rows=count_empty_rows, group_index=group_index, alpha=alpha
    )
    lengths = response_mask.bool().sum(dim=-1)
    relative = weights * lengths.sum().clamp(min=1)
    order = torch.argsort(lengths, stable=True)
    half = num_rows // 2
    short, long = relative[order[:half]].mean(), relative[order[num_rows - half :]].mean()
    return {"token_weight_long": long, "token_weight_short": short, "token_weight_long_over_short": long / short}

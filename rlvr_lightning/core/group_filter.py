"""GFPO's group filter (Shrivastava et al. 2025, "Sample More to Think Less", arXiv:2508.09726, sec. 3):
sample more responses per prompt than are trained on, and train on the `keep` of each group that a metric
ranks first.

Layout as in `advantage_estimators.py`: `num_prompts * group_size` rows, a prompt's rows contiguous.
"""

from __future__ import annotations

import torch
from torch import Tensor

GROUP_FILTER_METRICS = ("length", "token_efficiency", "first")


def group_filter_scores(rewards: Tensor, lengths: Tensor, metric: str) -> Tensor:
    """float[N], higher is kept first: `length`, the shortest responses (minus the length); `token_efficiency`,
    the most reward per token, `r_i / |o_i|` (GFPO sec. 3, "token efficiency"; an empty response counts 1 token);
    `first`, the responses sampled first (TTRL's downsampling, arXiv:2504.16084: the rewards vote over the whole
    group, the update trains on its first rows)."""
    lengths = lengths.to(torch.float64)
    if metric == "first":
        return -torch.arange(lengths.numel(), dtype=torch.float64, device=lengths.device)
    if metric == "length":
        return -lengths
    if metric == "token_efficiency":
        return rewards.to(torch.float64) / lengths.clamp(min=1.0)
    raise ValueError(f"group filter metric={metric!r} is not valid; choose one of {', '.join(GROUP_FILTER_METRICS)}")


def group_filter_rows(scores: Tensor, group_size: int, keep: int) -> Tensor:
    """long[num_prompts * keep]: the rows of each group's `keep` highest scores, in their order within the
    group; of equal scores the earlier row is kept (a stable sort)."""
    if not 1 <= keep <= group_size or scores.numel() % group_size:
        raise ValueError(f"cannot keep {keep} of each group of {group_size} among {scores.numel()} rows")
    grouped = scores.view(-1, group_size)
    ranked = torch.sort(grouped, dim=1, descending=True, stable=True).indices[:, :keep]
    first_rows = torch.arange(grouped.shape[0], device=scores.device).unsqueeze(1) * group_size
    return (ranked.sort(dim=1).values + first_rows).flatten()

"""GFPO's group filter (Shrivastava et al. 2025, "Sample More to Think Less", arXiv:2508.09726, sec. 3):
sample more responses per prompt than are trained on, and train on the `keep` of each group that a metric
ranks first; or on the `keep` whose rewards vary the most (PODS, `max_variance_rows`).

Layout as in `advantage_estimators.py`: `num_prompts * group_size` rows, a prompt's rows contiguous.
"""

from __future__ import annotations

import torch
from torch import Tensor

GROUP_FILTER_METRICS = ("length", "token_efficiency", "first", "max_variance")


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
    if metric == "max_variance":
        raise ValueError("max_variance keeps a subset, not the rows a score ranks first: use max_variance_rows")
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


def max_variance_rows(rewards: Tensor, group_size: int, keep: int) -> Tensor:
    """long[num_prompts * keep]: in each group, the `keep` rows whose rewards vary the most (PODS' max-variance
    down-sampling, Xu et al. 2025, arXiv:2504.13818), in their order within the group.

    The best subset is some `i` highest rewards with the `keep - i` lowest (PODS Lemma 3.2), so the `keep + 1`
    such subsets are compared; of equal variances the one with fewer high rewards, and of equal rewards the
    stable sort's order (the lowest take the earlier rows, the highest the later)."""
    if not 1 <= keep <= group_size or rewards.numel() % group_size:
        raise ValueError(f"cannot keep {keep} of each group of {group_size} among {rewards.numel()} rows")
    grouped = rewards.to(torch.float64).view(-1, group_size)
    order = torch.sort(grouped, dim=1, stable=True).indices  # ascending
    ranks = torch.arange(keep, device=rewards.device)
    highs = torch.arange(keep + 1, device=rewards.device).unsqueeze(1)  # i: how many of the highest
    # candidate i: sorted positions 0 .. keep-i-1 (lowest) then group_size-i .. group_size-1 (highest)
    positions = torch.where(ranks < keep - highs, ranks, group_size - keep + ranks)  # [keep + 1, keep]
    candidates = torch.gather(grouped, 1, order).unsqueeze(1).expand(-1, keep + 1, -1)
    picked = torch.gather(candidates, 2, positions.unsqueeze(0).expand(grouped.shape[0], -1, -1))
    # Var(S) of each candidate, the subsets' rewards in ascending order (equal subsets: equal values)
    # (PODS Algorithm 1: argmax_i Var({top i} + {bottom keep - i}))
    variances = picked.var(dim=2, unbiased=False)
    top = variances.amax(dim=1, keepdim=True)
    near_top = variances >= top - 1e-12 * (1.0 + top)  # equal but for rounding
    best = near_top.to(torch.int8).argmax(dim=1)  # the first: the fewest high rewards
    kept_positions = positions[best]  # [P, keep] sorted positions
    rows = torch.gather(order, 1, kept_positions).sort(dim=1).values
    first_rows = torch.arange(grouped.shape[0], device=rewards.device).unsqueeze(1) * group_size
    return (rows + first_rows).flatten()

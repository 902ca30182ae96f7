"""DCPO's smooth advantage standardization: each prompt's rewards standardized by this step's statistics and by
those of every step it was sampled in, smoothed into one advantage.

DCPO (Yang et al. 2025, "DCPO: Dynamic Clipping Policy Optimization", arXiv:2509.02333) keeps, per
prompt, the mean and standard deviation of all the rewards its responses have received over the run. At the
``i``-th step that samples a prompt (``t = i - 1`` earlier visits), a response with reward ``R`` gets

    A_new   = (R - mu_step) / sigma_step          this step's group (GRPO's advantage)
    A_total = (R - mu_total) / sigma_total        every group of the prompt so far, this one included
    SA_new   = (i - 1)/i A_new + 1/i A_total
    SA_total = 1/i A_new + (i - 1)/i A_total
    A = whichever of SA_new, SA_total is smaller in magnitude

so a group whose rewards all agree (A_new = 0) still gets ``A_total / i`` once the prompt has been answered
differently before. A standardization whose standard deviation is 0 contributes 0. The cumulative statistics
pool the groups as equal-sized samples: the mean of the means, and the mean of the variances plus the variance of
the means (the authors' ``get_mean_std``); each group's standard deviation is the unbiased one (``torch.std``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class PromptRewardStats(NamedTuple):
    """Per prompt ``[G]``: the mean and standard deviation of all its rewards so far and the steps that sampled it."""

    mean: Tensor
    std: Tensor
    visits: Tensor


def pooled_stats(prior: PromptRewardStats, step_mean: Tensor, step_std: Tensor) -> PromptRewardStats:
    """The statistics once this step's group (its mean and std) joins the ``prior.visits`` earlier ones."""
    t = prior.visits.to(step_mean)
    n = t + 1
    # mu = (t mu_old + mu_step) / (t + 1); var = (t var_old + var_step + t/(t+1) (mu_step - mu_old)^2) / (t + 1)
    # (DCPO, arXiv:2509.02333; the authors' core_algos.get_mean_std)
    mean = (prior.mean * t + step_mean) / n
    var = (t * prior.std**2 + step_std**2 + t / n * (step_mean - prior.mean) ** 2) / n
    return PromptRewardStats(mean, var.sqrt(), prior.visits + 1)


def _standardized(rewards: Tensor, mean: Tensor, std: Tensor, scale_by_std: bool) -> Tensor:
    centred = rewards - mean.unsqueeze(-1)
    if not scale_by_std:
        return centred
    spread = std.unsqueeze(-1)
    return torch.where(spread > 0, centred / spread.clamp_min(torch.finfo(rewards.dtype).tiny), 0.0)


def smooth_standardized_advantages(
    rewards: Tensor, group_size: int, prior: PromptRewardStats, scale_by_std: bool = True
) -> tuple[Tensor, PromptRewardStats]:
    """Advantages ``[N]`` for rewards ``[N]`` (``G = N / group_size`` groups, each a different prompt, rows of a group
    contiguous) given each prompt's statistics before this step, and the statistics after it."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.view(-1, group_size)
    step_mean, step_std = grouped.mean(dim=-1), grouped.std(dim=-1)
    total = pooled_stats(prior, step_mean, step_std)
    a_new = _standardized(grouped, step_mean, step_std, scale_by_std)
    a_total = _standardized(grouped, total.mean, total.std, scale_by_std)
    w = 1.0 / total.visits.to(rewards).unsqueeze(-1)  # 1/i
    # SA_new = (i-1)/i A_new + 1/i A_total; SA_total = 1/i A_new + (i-1)/i A_total; A = the smaller in magnitude
    # (DCPO, arXiv:2509.02333, smooth advantage standardization; the authors' compute_dcpo_outcome_advantage)
    sa_new = (1 - w) * a_new + w * a_total
    sa_total = w * a_new + (1 - w) * a_total
    advantages = torch.where(sa_new.abs() < sa_total.abs(), sa_new, sa_total)
    return advantages.reshape(-1), total

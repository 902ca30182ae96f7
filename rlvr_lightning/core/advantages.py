"""Group-relative advantage estimators (outcome rewards, one scalar per response).

Layout: ``num_prompts * group_size`` responses, the ``group_size`` responses of
one prompt stored contiguously. ``rewards`` is either flat ``[N]`` (then
``group_size`` is required) or already grouped ``[num_prompts, group_size]``
(then ``group_size`` may be ``None``). Every estimator returns a float tensor
of the SAME shape as its input; the trainer broadcasts it over the tokens of
each response.

Sign convention: a positive advantage means "make this response more likely".
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor


def _as_float(rewards: Tensor) -> Tensor:
    """Integer/bool rewards become the default float dtype; float dtypes are kept."""
    return rewards if rewards.is_floating_point() else rewards.to(torch.get_default_dtype())


def _grouped(rewards: Tensor, group_size: int | None) -> Tensor:
    """View ``rewards`` as ``[num_prompts, group_size]`` (validating the shapes)."""
    rewards = _as_float(rewards)
    if rewards.dim() == 2:
        if group_size is not None and group_size != rewards.shape[1]:
            raise ValueError(
                f"group_size={group_size} does not match rewards of shape {tuple(rewards.shape)} "
                f"(expected [num_prompts, group_size])"
            )
        return rewards
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be [N] or [num_prompts, group_size], got shape {tuple(rewards.shape)}")
    if group_size is None:
        raise ValueError("group_size is required when rewards are flat [N]")
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"group_size={group_size} must be >= 1 and divide the number of rewards ({rewards.numel()})")
    return rewards.view(-1, group_size)


def raw_advantages(rewards: Tensor, group_size: int | None = None) -> Tensor:
    """The rewards themselves: REINFORCE without a baseline."""
    # A_i = r_i  (Williams 1992, REINFORCE)
    return _as_float(rewards).clone()


def centered_advantages(rewards: Tensor, group_size: int | None = None) -> Tensor:
    """Reward minus its group's mean (no std division)."""
    grouped = _grouped(rewards, group_size)
    # A_i = r_i - mean(r_group)  (Dr. GRPO, Liu et al. 2025 "Understanding R1-Zero-Like Training", Fig. 1 / §3.1)
    return (grouped - grouped.mean(dim=1, keepdim=True)).view_as(rewards)


STD_SCOPES = ("group", "batch")


def normalized_advantages(
    rewards: Tensor,
    group_size: int | None = None,
    eps: float = 1e-6,
    unbiased_std: bool = True,
    std_scope: str = "group",
) -> Tensor:
    """GRPO advantage: centred by the group mean, divided by a std (+ eps).

    ``std_scope="group"``: std of the group (GRPO). ``std_scope="batch"``: std
    of all rewards in the batch, still centred by the group mean (Lite PPO).
    Groups with identical rewards get advantage exactly 0.
    """
    if std_scope not in STD_SCOPES:
        raise ValueError(f"unknown std_scope {std_scope!r}; valid choices: {', '.join(STD_SCOPES)}")
    grouped = _grouped(rewards, group_size)
    if grouped.shape[1] < 2:
        raise ValueError(
            f"normalized advantages need group_size >= 2, got {grouped.shape[1]}: the (unbiased) std of a "
            "single sample is undefined and its centred advantage is always 0"
        )
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    if std_scope == "group":
        std = grouped.std(dim=1, keepdim=True, unbiased=unbiased_std)
    else:
        # group mean, batch std  (Liu et al. 2025 "Tricks or Traps? A Deep Dive into RL for LLM Reasoning", Lite PPO §4.1)
        std = grouped.std(unbiased=unbiased_std)
    # A_i = (r_i - mean(r)) / (std(r) + eps)  (GRPO, Shao et al. 2024 DeepSeekMath §4.1.2 outcome supervision)
    return (centered / (std + eps)).view_as(rewards)


def max_only_advantages(rewards: Tensor, group_size: int | None = None) -> Tensor:
    """Keep the reward of responses that hit their group's max; everything else gets 0."""
    grouped = _grouped(rewards, group_size)
    group_max = grouped.max(dim=1, keepdim=True).values
    # A_i = r_i if r_i == max(r_group) else 0  (Stanford CS336 2025 lecture 17, compute_deltas mode "max_rewards")
    return torch.where(grouped == group_max, grouped, torch.zeros_like(grouped)).view_as(rewards)


def rloo_advantages(rewards: Tensor, group_size: int | None = None) -> Tensor:
    """Leave-one-out baseline: reward minus the mean of the OTHER rewards of the group."""
    grouped = _grouped(rewards, group_size)
    g = grouped.shape[1]
    if g < 2:
        raise ValueError(f"RLOO needs group_size >= 2 (the baseline averages the other samples), got {g}")
    # A_i = r_i - 1/(G-1) sum_{j!=i} r_j = G/(G-1) (r_i - mean)  (Ahmadian et al. 2024 "Back to Basics", RLOO estimator of Kool et al. 2019)
    others_mean = (grouped.sum(dim=1, keepdim=True) - grouped) / (g - 1)
    return (grouped - others_mean).view_as(rewards)


def batch_whitened_advantages(rewards: Tensor, group_size: int | None = None, eps: float = 1e-8) -> Tensor:
    """Whiten over the whole batch, ignoring groups (``group_size`` is unused)."""
    flat = _as_float(rewards)
    if flat.numel() < 2:
        raise ValueError(f"batch whitening needs at least 2 rewards to estimate a std, got {flat.numel()}")
    # A_i = (r_i - mean(r_batch)) / (std(r_batch) + eps)  (REINFORCE++, Hu 2025, global batch normalisation)
    return (flat - flat.mean()) / (flat.std(unbiased=True) + eps)


ADVANTAGE_ESTIMATORS: dict[str, Callable[..., Tensor]] = {
    "raw": raw_advantages,
    "centered": centered_advantages,
    "normalized": normalized_advantages,
    "max_only": max_only_advantages,
    "rloo": rloo_advantages,
    "batch_whitened": batch_whitened_advantages,
}


def compute_advantages(kind: str, rewards: Tensor, group_size: int | None = None, **kwargs) -> Tensor:
    """Dispatch to ``ADVANTAGE_ESTIMATORS[kind]``."""
    if kind not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {kind!r}; valid choices: {', '.join(ADVANTAGE_ESTIMATORS)}")
    return ADVANTAGE_ESTIMATORS[kind](rewards, group_size, **kwargs)


def zero_variance_group_mask(rewards: Tensor, group_size: int | None) -> Tensor:
    """bool ``[num_prompts]``: True for groups whose rewards are all equal (no learning signal)."""
    grouped = _grouped(rewards, group_size)
    # all-equal group <=> max == min  (DAPO, Yu et al. 2025 §3.2 dynamic sampling filters these groups)
    return grouped.max(dim=1).values == grouped.min(dim=1).values


def zero_variance_group_fraction(rewards: Tensor, group_size: int | None) -> Tensor:
    """Scalar: fraction of groups whose rewards are all equal."""
    return zero_variance_group_mask(rewards, group_size).float().mean()

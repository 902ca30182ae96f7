"""Which tokens the update's loss counts: the sampled ones, less those of truncated responses (DAPO's overlong
filtering) and those of prompts whose rewards all agree (ScaleRL's zero-variance filtering)."""

from __future__ import annotations

from torch import Tensor

from rlvr_lightning.core.advantage_estimators import uniform_reward_groups
from rlvr_lightning.modules.aggregation_options import AggregationConfig
from rlvr_lightning.rollout import Rollout


def loss_mask(part: Rollout, aggregation: AggregationConfig, dropped_groups: Tensor | None = None) -> Tensor:
    """bool `[n, T]`: the tokens the loss counts: the sampled ones, less those of truncated responses with
    `aggregation.mask_truncated` (DAPO's overlong filtering: `response_mask * ~truncated`, TRL) and those of the
    prompts `dropped_groups` marks (bool, by `group_index`: `zero_variance_groups`)."""
    mask = part.response_mask.bool()
    if aggregation.mask_truncated:
        mask = mask & ~part.truncated.to(mask.device).unsqueeze(-1)
    if dropped_groups is not None:
        mask = mask & ~dropped_groups[part.group_index].unsqueeze(-1)
    return mask


def zero_variance_groups(rollout: Rollout, aggregation: AggregationConfig) -> Tensor | None:
    """bool `[N]` by `group_index`: the prompts whose rewards all agree, with `aggregation.mask_zero_variance_groups`
    (None without it)."""
    if not aggregation.mask_zero_variance_groups:
        return None
    if rollout.reward is None:
        raise ValueError("aggregation.mask_zero_variance_groups reads the rewards, and this rollout has none")
    # ScaleRL (Khatri et al. 2025) zero-variance filtering: prompts with equal rewards leave the loss
    return uniform_reward_groups(rollout.reward, rollout.group_index, rollout.num_rows)

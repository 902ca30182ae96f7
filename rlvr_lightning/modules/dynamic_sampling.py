"""DAPO's dynamic sampling (Yu et al. 2025, sec. 3.2): train only on groups whose rewards differ.

A group whose responses all got the same reward has zero advantage under every group
baseline, so it adds nothing but noise to the batch size. Such groups are dropped and the
batch is topped up with fresh prompts, for at most `max_rounds` generation rounds in all. If
the batch is still short, it is filled with dropped groups (advantage 0), so that every
update has the same size (under DDP every rank must run the same number of micro-batches).
"""

from __future__ import annotations

from collections.abc import Callable

from rlvr_lightning.core.advantage_estimators import zero_variance_group_mask
from rlvr_lightning.rollout import Rollout


def keep_informative_groups(
    rollout: Rollout, sample_more: Callable[[], Rollout], max_rounds: int
) -> tuple[Rollout, dict[str, float]]:
    """A rollout of `rollout.num_groups` groups, informative ones first, and what it took.

    `rollout` and every result of `sample_more()` must already be scored (`reward` set).
    """
    target, group_size = rollout.num_groups, rollout.group_size
    kept: list[Rollout] = []
    dropped: list[Rollout] = []
    sampled = 0
    for round_index in range(max_rounds):
        if round_index > 0:
            rollout = sample_more()
        sampled += rollout.num_groups
        informative = (~zero_variance_group_mask(rollout.reward, group_size)).repeat_interleave(group_size)
        kept.append(rollout.select(informative.nonzero().squeeze(-1)))
        dropped.append(rollout.select((~informative).nonzero().squeeze(-1)))
        if sum(part.num_groups for part in kept) >= target:
            break
    num_kept = sum(part.num_groups for part in kept)
    merged = Rollout.concat([*kept, *dropped]).select(slice(0, target * group_size))
    stats = {
        "rounds": float(round_index + 1),
        "prompts_sampled": float(sampled),
        "filled_with_dropped": float(max(0, target - num_kept)),
    }
    return merged, stats


class TopUpPrompts:
    """More prompts for the top-ups: `RLVRDataModule.topup_batch` (resumable and rank-aware), or for any other data
    module a second pass over its training data."""

    def __init__(self) -> None:
        self.batches = None

    def next(self, datamodule):
        if hasattr(datamodule, "topup_batch"):
            return datamodule.topup_batch()
        if self.batches is None:
            self.batches = iter(datamodule.train_dataloader())
        try:
            return next(self.batches)
        except StopIteration:
            self.batches = iter(datamodule.train_dataloader())
            return next(self.batches)

"""GFPO (Shrivastava et al. 2025, arXiv:2508.09726): sample `group_size` responses per prompt, train on `keep`.

After scoring, each group keeps the `keep` responses that `metric` ranks first (the shortest, the most reward per
token, or the first sampled), or the `keep` whose rewards vary the most (PODS' max-variance down-sampling, Xu et
al. 2025, arXiv:2504.13818) and the rest leave the step: advantages are computed over the kept responses alone
(GFPO's `(r_i - mean_S) / std_S` over the retained set S) and only they are scored for log-probs and trained on.
The paper's adaptive-difficulty variant, which keeps more of a hard prompt's responses, is not offered: every group
keeps the same number, so the advantage estimators and the update see groups of `keep`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated

from torch import Tensor

from rlvr_lightning.core.group_filter import (
    GROUP_FILTER_METRICS,
    group_filter_rows,
    group_filter_scores,
    max_variance_rows,
)
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import OneOf, Range


@documented_options
@dataclass(frozen=True)
class GroupFilterConfig:
    """GFPO's group filter: train on `keep` of the `group_size` responses sampled per prompt."""

    keep: Annotated[
        int | None,
        Option(
            "responses per prompt trained on, of the group_size sampled (null: all of them).",
            Range(1, integer=True, optional=True),
        ),
    ] = None
    metric: Annotated[
        str,
        Option(
            "which responses are kept: length (the shortest), token_efficiency (the most reward per token), "
            "first (the first sampled: TTRL's downsampling) or max_variance (those whose rewards vary the most: "
            "PODS).",
            OneOf(GROUP_FILTER_METRICS),
        ),
    ] = "length"

    def __post_init__(self) -> None:
        check_options(GroupFilterConfig, vars(self), "group_filter.")

    def trained_group_size(self, group_size: int) -> int:
        """The responses per prompt that reach the advantages and the update."""
        if self.keep is not None and self.keep > group_size:
            raise ValueError(
                f"group_filter.keep={self.keep} must be at most group_size={group_size}: it keeps that many of the "
                "responses sampled per prompt"
            )
        return group_size if self.keep is None else self.keep


def filter_groups(rollout: Rollout, config: GroupFilterConfig) -> tuple[Rollout, dict[str, Tensor]]:
    """`rollout` (scored) with each group cut to `config.keep` rows, and the sampled and kept means."""
    lengths = rollout.response_lengths()
    if config.metric == "max_variance":
        rows = max_variance_rows(rollout.reward, rollout.group_size, config.keep)
    else:
        rows = group_filter_rows(group_filter_scores(rollout.reward, lengths, config.metric), rollout.group_size,
                                 config.keep)  # fmt: skip
    kept = dataclasses.replace(rollout.select(rows), group_size=config.keep)
    stats = {
        "length_sampled": lengths.mean(),
        "length_kept": lengths[rows].mean(),
        "reward_sampled": rollout.reward.mean(),
        "reward_kept": kept.reward.mean(),
    }
    return kept, stats

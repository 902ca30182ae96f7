"""The sizes a mini-batch's loss is divided by, computed once per mini-batch and handed to each of its
micro-batches, so that the micro-batches' losses add up to the loss of the whole mini-batch."""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from rlvr_lightning.core.aggregation import DELTA_L_MODE, PROMPT_MODE, group_token_table, length_powers, non_empty_rows
from rlvr_lightning.core.losses.positive_example import correct_token_count
from rlvr_lightning.modules.aggregation_options import AggregationConfig
from rlvr_lightning.rollout import Rollout


class MiniBatchSizes(NamedTuple):
    num_sequences: int | Tensor  # the rows (with tokens only, unless aggregation.count_empty_rows)
    num_tokens: int | Tensor  # the tokens the loss counts
    num_correct: Tensor | None = None  # the tokens of correct responses (VAPO's positive-example NLL), when read
    group_tokens: Tensor | None = None  # prompt-mean-token-mean: each prompt group's tokens, by group_index
    num_groups: Tensor | None = None  # prompt-mean-token-mean: the prompt groups
    length_power_sum: Tensor | None = None  # delta-l: the sum of the rows' |o_i|^-alpha

    def of_rows(self, part: Rollout) -> dict[str, int | Tensor | None]:
        """`aggregate_loss`'s normalisers for the rows of `part`, a micro-batch of this mini-batch."""
        group_tokens = None if self.group_tokens is None else self.group_tokens[part.group_index]
        return {
            "num_sequences": self.num_sequences,
            "num_tokens": self.num_tokens,
            "group_tokens": group_tokens,
            "num_groups": self.num_groups,
            "length_power_sum": self.length_power_sum,
        }


def mini_batch_sizes(
    minibatch: Rollout, mask: Tensor | None, aggregation: AggregationConfig, num_slots: int, reads_correct: bool
) -> MiniBatchSizes:
    """The sizes of `minibatch` under its loss `mask` (None: every position of every row is a token);
    `num_slots` bounds its `group_index` (the whole rollout's rows)."""
    num_positions = minibatch.response_mask.shape[1]
    num_tokens = mask.sum() if mask is not None else minibatch.response_mask.numel()
    num_sequences = minibatch.num_rows
    if mask is not None and not aggregation.count_empty_rows:
        num_sequences = non_empty_rows(mask)
    num_correct = correct_token_count(minibatch.correct, mask, num_positions) if reads_correct else None
    group_tokens = num_groups = length_power_sum = None
    counts = minibatch.response_mask.new_full((minibatch.num_rows,), num_positions) if mask is None else mask.sum(-1)
    if aggregation.mode == DELTA_L_MODE:
        length_power_sum = length_powers(counts, aggregation.alpha).sum()
    if aggregation.mode == PROMPT_MODE:
        group_tokens, num_groups = group_token_table(
            counts, minibatch.group_index, num_slots, count_empty_groups=aggregation.count_empty_rows
        )
    return MiniBatchSizes(num_sequences, num_tokens, num_correct, group_tokens, num_groups, length_power_sum)

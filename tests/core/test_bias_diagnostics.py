"""Dr. GRPO's bias diagnostics and the per-token weights of each aggregation, by hand and against autograd."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.aggregation import AGGREGATION_MODES, aggregate_loss, token_weights
from rlvr_lightning.core.bias_diagnostics import group_std_quantiles, length_by_correctness, long_short_token_weights


def lengths_mask(lengths, width=None):
    lengths = torch.tensor(lengths)
    return (torch.arange(width or int(lengths.max())).unsqueeze(0) < lengths.unsqueeze(1)).float()


def test_token_weights_by_hand():
    mask = lengths_mask([1, 2, 4])  # 3 responses, 7 tokens
    assert_close(token_weights(mask, "seq-mean-token-mean"), torch.tensor([1 / 3, 1 / 6, 1 / 12]))
    assert_close(token_weights(mask, "token-mean"), torch.full((3,), 1 / 7))
    assert_close(token_weights(mask, "seq-mean-token-sum"), torch.full((3,), 1 / 3))
    assert_close(token_weights(mask, "seq-sum-constant", constant=4.0), torch.full((3,), 1 / 12))


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
@pytest.mark.parametrize("count_empty_rows", [True, False])
def test_token_weights_are_the_gradient_of_the_aggregated_loss(mode, count_empty_rows):
    mask = lengths_mask([3, 0, 1, 5, 2], width=6)
    loss = torch.randn(5, 6, requires_grad=True)
    groups = torch.tensor([0, 1, 0, 2, 1])  # prompt-mean-token-mean's prompts (the others ignore them)
    options = dict(constant=6.0, count_empty_rows=count_empty_rows, group_index=groups)
    aggregate_loss(loss, mask, mode, **options).backward()
    weights = token_weights(mask, mode, **options)
    assert_close(loss.grad, weights.unsqueeze(1) * mask)


def test_long_short_weights_by_hand():
    mask = lengths_mask([4, 1, 5, 2])
    # seq-mean-token-mean: relative weight = 12 tokens / (4 L) = 3 / L: [.75, 3, .6, 1.5];
    # short {1, 2}: 2.25, long {4, 5}: .675
    stats = long_short_token_weights(mask, "seq-mean-token-mean")
    assert_close(stats["token_weight_short"], torch.tensor(2.25))
    assert_close(stats["token_weight_long"], torch.tensor(0.675))
    assert_close(stats["token_weight_long_over_short"], torch.tensor(0.3))
    for mode in ("token-mean", "seq-sum-constant", "seq-mean-token-sum"):  # no length bias: a ratio of 1
        assert_close(
            long_short_token_weights(mask, mode, constant=5.0)["token_weight_long_over_short"], torch.tensor(1.0)
        )


def test_length_by_correctness_by_hand():
    mask = lengths_mask([1, 2, 4, 5])
    stats = length_by_correctness(mask, torch.tensor([True, False, True, False]))
    assert_close(stats["length_correct"], torch.tensor(2.5))
    assert_close(stats["length_incorrect"], torch.tensor(3.5))
    none_correct = length_by_correctness(mask, torch.zeros(4, dtype=torch.bool))
    assert math.isnan(float(none_correct["length_correct"])) and float(none_correct["length_incorrect"]) == 3.0


def test_group_std_quantiles_by_hand():
    # unbiased stds of [0,1], [1,1], [0,2], [3,3], [0,4]: .7071, 0, 1.4142, 0, 2.8284; sorted 0, 0, .71, 1.41, 2.83
    rewards = torch.tensor([0.0, 1.0, 1.0, 1.0, 0.0, 2.0, 3.0, 3.0, 0.0, 4.0])
    stats = group_std_quantiles(rewards, group_size=2)
    assert_close(stats["group_reward_std_q10"], torch.tensor(0.0))
    assert_close(stats["group_reward_std_q50"], torch.tensor(math.sqrt(0.5)))
    assert_close(stats["group_reward_std_q90"], torch.tensor(math.sqrt(2) + 0.6 * (math.sqrt(8) - math.sqrt(2))))
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        group_std_quantiles(rewards, group_size=1)

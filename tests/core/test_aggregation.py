import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.aggregation import AGGREGATION_MODES, aggregate_loss, group_token_table, length_powers

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])  # row sums 3 and 4, lengths 2 and 1


def test_seq_mean_token_mean():
    # (3/2 + 4/1) / 2 = 2.75
    assert_close(aggregate_loss(LOSS, MASK, "seq-mean-token-mean"), torch.tensor(2.75))


def test_token_mean():
    # (1 + 2 + 4) / 3
    assert_close(aggregate_loss(LOSS, MASK, "token-mean"), torch.tensor(7.0 / 3.0))


def test_seq_mean_token_sum():
    # (3 + 4) / 2
    assert_close(aggregate_loss(LOSS, MASK, "seq-mean-token-sum"), torch.tensor(3.5))


def test_seq_sum_constant():
    # (3 + 4) / 4 / 2
    assert_close(aggregate_loss(LOSS, MASK, "seq-sum-constant", constant=4), torch.tensor(0.875))
    with pytest.raises(ValueError, match="constant"):
        aggregate_loss(LOSS, MASK, "seq-sum-constant")
    with pytest.raises(ValueError, match="constant"):
        aggregate_loss(LOSS, MASK, "seq-sum-constant", constant=0)


def test_prompt_mean_token_mean_by_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 0]])
    groups = torch.tensor([0, 0, 1])
    # prompt 0: (1 + 2 + 4) / 3 tokens; prompt 1: (7 + 8) / 2; the mean of the two prompts = 59 / 12
    assert_close(aggregate_loss(loss, mask, "prompt-mean-token-mean", group_index=groups), torch.tensor(59 / 12))
    # unlike token-mean (22 / 5) and seq-mean-token-mean ((1.5 + 4 + 7.5) / 3)
    assert aggregate_loss(loss, mask, "token-mean").item() == pytest.approx(22 / 5)
    assert aggregate_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(13 / 3)
    # a prompt without a token counts in the divisor unless count_empty_rows is False
    empty = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    assert_close(aggregate_loss(loss, empty, "prompt-mean-token-mean", group_index=groups), torch.tensor(7 / 6))
    assert_close(
        aggregate_loss(loss, empty, "prompt-mean-token-mean", group_index=groups, count_empty_rows=False),
        torch.tensor(7 / 3),
    )
    with pytest.raises(ValueError, match="group_index"):
        aggregate_loss(loss, mask, "prompt-mean-token-mean")


def test_group_token_table_counts_each_groups_tokens_and_the_groups():
    tokens, groups = group_token_table(torch.tensor([2.0, 1.0, 0.0, 3.0]), torch.tensor([4, 4, 1, 0]), num_slots=6)
    assert_close(tokens, torch.tensor([3.0, 0.0, 0.0, 0.0, 3.0, 0.0]))
    assert groups.item() == 3
    _, with_tokens = group_token_table(torch.tensor([2.0, 1.0, 0.0, 3.0]), torch.tensor([4, 4, 1, 0]), None, False)
    assert with_tokens.item() == 2


def test_explicit_normalisers_override_defaults():
    assert_close(aggregate_loss(LOSS, MASK, "token-mean", num_tokens=7), torch.tensor(1.0))
    assert_close(aggregate_loss(LOSS, MASK, "seq-mean-token-sum", num_sequences=7), torch.tensor(1.0))


def test_all_zero_mask_rows_contribute_zero_not_nan():
    loss = torch.tensor([[2.0, 4.0], [float("nan"), float("nan")]])
    mask = torch.tensor([[1, 1], [0, 0]])
    groups = torch.tensor([0, 1])
    expected = {
        "seq-mean-token-mean": 1.5,
        "token-mean": 3.0,
        "seq-mean-token-sum": 3.0,
        "seq-sum-constant": 1.5,
        "prompt-mean-token-mean": 1.5,
    }
    for mode, value in expected.items():
        assert_close(aggregate_loss(loss, mask, mode, constant=2, group_index=groups), torch.tensor(value))
    for mode in AGGREGATION_MODES:
        assert aggregate_loss(loss, torch.zeros(2, 2), mode, constant=2, group_index=groups).item() == 0.0


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_micro_batches_with_global_normalisers_match_full_batch(mode):
    # uneven rows (lengths 1, 3, 2, 0) split unevenly (1 row | 3 rows): the case where naive averaging breaks
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 1, 0], [0, 0, 0]])
    groups = torch.tensor([0, 1, 1, 0])  # prompt-mean-token-mean: prompt 0 is split across the micro-batches
    full_loss = values.clone().requires_grad_(True)
    full = aggregate_loss(full_loss, mask, mode, constant=3, group_index=groups)
    full.backward()

    micro_loss = values.clone().requires_grad_(True)
    table, num_groups = group_token_table(mask.sum(-1), groups)
    power_sum = length_powers(mask.sum(-1), 0.75).sum()  # delta-l: the mini-batch's sum of |o_i|^-alpha
    totals = dict(num_sequences=4, num_tokens=mask.sum(), constant=3, num_groups=num_groups, length_power_sum=power_sum)
    micro = sum(
        aggregate_loss(micro_loss[rows], mask[rows], mode, group_tokens=table[groups[rows]], **totals)
        for rows in (slice(0, 1), slice(1, 4))
    )
    micro.backward()

    assert_close(micro, full)
    assert_close(micro_loss.grad, full_loss.grad)


def test_micro_batches_without_global_normalisers_do_not_match():
    # guards the test above: token-mean per micro-batch then averaged is NOT the full token-mean
    values = torch.tensor([[1.0, 0.0, 0.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    full = aggregate_loss(values, mask, "token-mean")  # 16 / 4 = 4
    naive = (
        aggregate_loss(values[:1], mask[:1], "token-mean") + aggregate_loss(values[1:], mask[1:], "token-mean")
    ) / 2
    assert_close(full, torch.tensor(4.0))
    assert_close(naive, torch.tensor(3.0))  # (1 + 5) / 2


def test_unknown_mode_lists_choices():
    with pytest.raises(ValueError) as err:
        aggregate_loss(LOSS, MASK, "mean")
    assert "'mean'" in str(err.value) and all(mode in str(err.value) for mode in AGGREGATION_MODES)


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_no_mask_equals_an_all_ones_mask(mode):
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    # by hand: seq-mean-token-mean (2 + 5) / 2 = 3.5; token-mean 21 / 6 = 3.5; seq-mean-token-sum 21 / 2 = 10.5;
    # seq-sum-constant with C = 4: (6 / 4 + 15 / 4) / 2 = 2.625; prompt-mean-token-mean, one prompt: 21 / 6;
    # delta-l, equal lengths: weights 1/2 each, (6 + 15) / 2 / 4 = 2.625
    expected = {
        "seq-mean-token-mean": 3.5,
        "token-mean": 3.5,
        "seq-mean-token-sum": 10.5,
        "seq-sum-constant": 2.625,
        "prompt-mean-token-mean": 3.5,
        "delta-l": 2.625,
    }[mode]
    groups = torch.tensor([0, 0])
    assert aggregate_loss(loss, None, mode, constant=4.0, group_index=groups).item() == pytest.approx(expected)
    assert aggregate_loss(loss, torch.ones(2, 3), mode, constant=4.0, group_index=groups).item() == pytest.approx(
        expected
    )


def test_count_empty_rows_false_divides_by_rows_with_tokens_only():
    # an empty third row: seq means 3/2, 4/1, - ; verl divides by the 2 rows with tokens, we by all 3 by default
    loss = torch.cat([LOSS, torch.tensor([[7.0, 8.0, 9.0]])])
    mask = torch.cat([MASK, torch.tensor([[0, 0, 0]])])
    assert_close(aggregate_loss(loss, mask, "seq-mean-token-mean"), torch.tensor(5.5 / 3))
    assert_close(aggregate_loss(loss, mask, "seq-mean-token-mean", count_empty_rows=False), torch.tensor(5.5 / 2))
    assert_close(aggregate_loss(loss, mask, "seq-mean-token-sum", count_empty_rows=False), torch.tensor(7.0 / 2))
    assert_close(
        aggregate_loss(loss, mask, "seq-sum-constant", constant=4, count_empty_rows=False), torch.tensor(7.0 / 4 / 2)
    )
    # token-mean has no sequence count; an all-empty batch is 0, not NaN
    assert_close(aggregate_loss(loss, mask, "token-mean", count_empty_rows=False), torch.tensor(7.0 / 3))
    empty = aggregate_loss(loss, torch.zeros_like(mask), "seq-mean-token-mean", count_empty_rows=False)
    assert empty.item() == 0.0


def test_non_empty_rows_split_into_micro_batches_sum_to_the_whole():
    from rlvr_lightning.core.aggregation import non_empty_rows

    loss = torch.arange(12.0).view(4, 3)
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0], [0, 0, 0]])
    whole = aggregate_loss(loss, mask, "seq-mean-token-mean", count_empty_rows=False)
    rows = non_empty_rows(mask)
    parts = [
        aggregate_loss(loss[i : i + 2], mask[i : i + 2], "seq-mean-token-mean", num_sequences=rows) for i in (0, 2)
    ]
    assert rows.item() == 2
    assert_close(sum(parts), whole)  # (0.5 + 6) / 2
    assert_close(whole, torch.tensor(3.25))

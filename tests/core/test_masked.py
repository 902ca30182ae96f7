import math

import torch
from torch.testing import assert_close

from rlvr_lightning.core.masked import join_masked, masked_mean, masked_normalize, masked_sum, masked_var

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [0, 1, 0]])  # kept: 1, 2, 5


def test_masked_sum_all_and_per_dim():
    assert_close(masked_sum(VALUES, MASK), torch.tensor(8.0))
    assert_close(masked_sum(VALUES, MASK, dim=-1), torch.tensor([3.0, 5.0]))
    assert_close(masked_sum(VALUES, MASK, dim=0), torch.tensor([1.0, 7.0, 0.0]))


def test_masked_mean_all_and_per_dim():
    assert_close(masked_mean(VALUES, MASK), torch.tensor(8.0 / 3.0))
    assert_close(masked_mean(VALUES, MASK, dim=-1), torch.tensor([1.5, 5.0]))
    # column 2 is fully masked: 0, not NaN
    assert_close(masked_mean(VALUES, MASK, dim=0), torch.tensor([1.0, 3.5, 0.0]))


def test_masked_reductions_accept_bool_mask():
    assert_close(masked_mean(VALUES, MASK.bool()), torch.tensor(8.0 / 3.0))


def test_all_zero_mask_gives_zero_not_nan():
    zero = torch.zeros_like(MASK)
    assert masked_sum(VALUES, zero).item() == 0.0
    assert masked_mean(VALUES, zero).item() == 0.0
    assert masked_var(VALUES, zero).item() == 0.0


def test_nan_in_masked_out_position_does_not_leak():
    values = torch.tensor([[1.0, float("nan")], [3.0, float("inf")]])
    mask = torch.tensor([[1, 0], [1, 0]])
    assert_close(masked_mean(values, mask), torch.tensor(2.0))


def test_masked_var_unbiased_and_biased():
    # mean 8/3; squared deviations 25/9 + 4/9 + 49/9 = 26/3
    assert_close(masked_var(VALUES, MASK, unbiased=True), torch.tensor(13.0 / 3.0))  # / (3 - 1)
    assert_close(masked_var(VALUES, MASK, unbiased=False), torch.tensor(26.0 / 9.0))  # / 3


def test_masked_normalize_whitens_and_zeroes_masked():
    values = torch.tensor([[1.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 0]])
    # mean 2, unbiased var (1 + 1) / 1 = 2 -> (v - 2) / sqrt(2)
    s = 1.0 / math.sqrt(2.0)
    assert_close(masked_normalize(values, mask), torch.tensor([[-s, s, 0.0]]))
    assert_close(masked_normalize(values, mask, shift_mean=False), torch.tensor([[2.0 - s, 2.0 + s, 0.0]]))


def test_no_mask_is_the_plain_reduction():
    assert_close(masked_sum(VALUES, None), VALUES.sum())
    assert_close(masked_mean(VALUES, None, dim=-1), VALUES.mean(-1))
    assert_close(masked_mean(VALUES, None), VALUES.mean())
    assert_close(masked_var(VALUES, None), VALUES.var())
    assert masked_mean(torch.zeros(0, 3), None).item() == 0.0


def test_join_masked_flattens_and_fills_missing_masks_with_ones():
    values, mask = join_masked(
        [torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0], [4.0]])], [torch.tensor([[1, 0]]), None]
    )
    assert values.tolist() == [1.0, 2.0, 3.0, 4.0] and mask.tolist() == [True, False, True, True]
    assert_close(masked_mean(values, mask), torch.tensor(8.0 / 3.0))
    assert join_masked([torch.ones(2, 2)], [None])[1] is None

import math

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.entropy import entropy_from_logits


def test_uniform_over_four_is_log_four():
    assert_close(entropy_from_logits(torch.zeros(2, 3, 4)), torch.full((2, 3), math.log(4.0)))


def test_quarter_three_quarters():
    # p = [1/4, 3/4]: H = .25 ln 4 + .75 ln(4/3) = 0.562335
    assert_close(entropy_from_logits(torch.tensor([0.0, math.log(3.0)])), torch.tensor(0.562335), atol=1e-6, rtol=1e-6)
    # temperature 2 on doubled logits gives the same distribution
    assert_close(
        entropy_from_logits(torch.tensor([0.0, 2 * math.log(3.0)]), temperature=2.0),
        torch.tensor(0.562335),
        atol=1e-6,
        rtol=1e-6,
    )


def test_one_hot_ish_is_zero():
    assert entropy_from_logits(torch.tensor([100.0, 0.0, 0.0])).abs().item() < 1e-6


def test_neg_inf_logits_are_probability_zero_not_nan():
    assert_close(entropy_from_logits(torch.tensor([0.0, 0.0, float("-inf")])), torch.tensor(math.log(2.0)))


def test_bf16_upcast():
    out = entropy_from_logits(torch.zeros(4, dtype=torch.bfloat16))
    assert out.dtype == torch.float32
    assert_close(out, torch.tensor(math.log(4.0)))


def test_rejects_non_positive_temperature():
    with pytest.raises(ValueError, match="temperature"):
        entropy_from_logits(torch.zeros(4), temperature=-1.0)


def test_entropy_from_log_probs_matches_hand_values():
    from rlvr_lightning.core.entropy import entropy_from_log_probs

    # p = [1/4, 3/4]: H = 0.562335 (as above); p = [1, 0]: H = 0 with the -inf entry contributing 0
    log_probs = torch.tensor([[math.log(0.25), math.log(0.75)], [0.0, -math.inf]])
    assert_close(entropy_from_log_probs(log_probs), torch.tensor([0.562335, 0.0]), atol=1e-6, rtol=1e-6)

"""ΔL Normalization (He et al. 2025, arXiv:2509.07558): aggregation mode ``delta-l``, checked by hand and against the
authors' code (zerolllin/Delta-L-Normalization 89da5b9, verl's core_algos with ``use_grpopp``), restated below."""

import math

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.aggregation import aggregate_loss, length_powers, token_weights

# two responses padded to M = 4: A has 2 tokens (losses 1, 3: sum 4), B has 4 (2, 0, 4, 2: sum 8)
LOSS = torch.tensor([[1.0, 3.0, 9.0, 9.0], [2.0, 0.0, 4.0, 2.0]])
MASK = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])


@pytest.mark.parametrize(
    ("alpha", "expected"),
    [
        (1.0, 4 / 3),  # weights 1/2, 1/4 -> 2/3, 1/3: (2/3 * 4 + 1/3 * 8) / 4 = 16/3 / 4
        (0.5, math.sqrt(2)),  # weights 2^-1/2, 1/2 -> 2 - sqrt 2, sqrt 2 - 1: (4 (2 - sqrt 2) + 8 (sqrt 2 - 1)) / 4
        (0.0, 1.5),  # equal weights: (4 + 8) / 2 / 4, seq-sum-constant's
    ],
)
def test_delta_l_by_hand(alpha, expected):
    loss = aggregate_loss(LOSS, MASK, "delta-l", constant=4, alpha=alpha)
    assert loss.item() == pytest.approx(expected)


def test_alpha_zero_is_seq_sum_constant():
    g = torch.Generator().manual_seed(0)
    loss, mask = torch.randn(6, 7, generator=g), (torch.rand(6, 7, generator=g) > 0.4).float()
    mask[2] = 0  # an empty row weighs nothing, and is not counted
    assert_close(
        aggregate_loss(loss, mask, "delta-l", constant=7, alpha=0.0),
        aggregate_loss(loss, mask, "seq-sum-constant", constant=7, count_empty_rows=False),
    )


def test_alpha_one_weighs_responses_as_grpo_does():
    # alpha = 1: each token of response i weighs 1/|o_i| relative to the others, as under seq-mean-token-mean; only
    # the scale differs (1 / (M sum_j 1/|o_j|) instead of 1 / G)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
    ours = token_weights(mask, "delta-l", constant=5, alpha=1.0)
    grpo = token_weights(mask, "seq-mean-token-mean")
    assert_close(ours / ours.sum(), grpo / grpo.sum())
    assert_close(ours, torch.tensor([1 / 3, 1.0, 1 / 5]) / (5 * (1 / 3 + 1 + 1 / 5)))


def test_rows_without_tokens_weigh_nothing():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert_close(length_powers(mask.sum(-1), 0.75), torch.tensor([2**-0.75, 0.0]))
    loss = torch.tensor([[1.0, 2.0, 5.0], [100.0, 100.0, 100.0]])
    assert aggregate_loss(loss, mask, "delta-l", constant=3).item() == pytest.approx(3 / 3)
    assert aggregate_loss(loss, torch.zeros_like(mask), "delta-l", constant=3).item() == 0.0


def test_delta_l_needs_a_constant():
    with pytest.raises(ValueError, match="mode 'delta-l' needs a constant > 0"):
        aggregate_loss(LOSS, MASK, "delta-l")


def _authors_loss(pg_losses: np.ndarray, response_mask: np.ndarray, alpha: float) -> float:
    """zerolllin/Delta-L-Normalization 89da5b9, verl/trainer/ppo/core_algos.py: compute_grpo_outcome_advantage
    (use_grpopp) weights each response's score, then compute_policy_loss's masked_mean_allavg averages over the padded
    B x M tensor. The weight multiplies the advantage, so for a loss linear in it (here: -A * l) it multiplies the
    per-token loss, as `aggregate_loss` applies it."""
    valid_length_list = response_mask.sum(axis=1).tolist()
    mean_length = float(np.mean(valid_length_list))
    length_reciprocal_list = []
    for length in valid_length_list:
        length_reciprocal_list.append(1 / ((length / mean_length) ** alpha))
    length_reciprocal_mean = float(np.mean(length_reciprocal_list))
    weights = np.array([r / length_reciprocal_mean for r in length_reciprocal_list])
    return float((pg_losses * weights[:, None] * response_mask).mean())  # masked_mean_allavg


@pytest.mark.parametrize("alpha", [0.0, 0.75, 1.0])
def test_equals_the_authors_code(alpha):
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        rows, width = int(torch.randint(2, 9, (1,), generator=g)), int(torch.randint(1, 12, (1,), generator=g))
        lengths = torch.randint(1, width + 1, (rows,), generator=g)
        mask = (torch.arange(width)[None] < lengths[:, None]).float()
        loss = torch.randn(rows, width, generator=g, dtype=torch.float64)
        ours = aggregate_loss(loss, mask.double(), "delta-l", constant=width, alpha=alpha)
        assert ours.item() == pytest.approx(_authors_loss(loss.numpy(), mask.numpy(), alpha), rel=1e-12, abs=1e-12)

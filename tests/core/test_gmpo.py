"""GMPO against a hand-computed example and against verl's own loss restated line by line (values and gradients
within 1e-6 in float64)."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.aggregation import aggregate_loss
from rlvr_lightning.core.importance_sampling import rollout_is_weights
from rlvr_lightning.core.losses.policy_losses import GMPO, policy_loss
from tests.core.test_losses_against_trl import F64, TOL, random_batch, value_and_grad
from tests.core.verl_restated import verl_geo_mean_loss

LN2 = math.log(2.0)
MODE = "seq-mean-token-mean"


def gmpo_scalar(loss, log_probs, old, advantages, mask, weights=None):
    if weights is None:
        out = loss(log_probs, old, advantages, mask)
    else:
        out = loss.with_rollout_is(log_probs, old, advantages, mask, weights)
    return aggregate_loss(out.loss, mask, MODE), out


def test_gmpo_by_hand():
    # clip 0.5 in log space. Row 0, A = +2, log-ratios [ln 2, -ln 2]: ln 2 = 0.69 > 0.5 is cut to 0.5 (A > 0 cuts
    # the upper side), -ln 2 stays (the lower side is not cut for A > 0): R_0 = exp((0.5 - ln 2) / 2), l_0 = -2 R_0;
    # only the second token moves the loss: d l_0 / d logp_2 = -2 R_0 / 2 = -R_0.
    # Row 1 (one token and one padding), A = -1, log-ratio -ln 2 < -0.5 is cut to -0.5 (A < 0 cuts the lower side):
    # R_1 = e^-0.5, l_1 = e^-0.5, no gradient. Loss (l_0 + l_1) / 2.
    log_probs = torch.zeros(2, 2, **F64, requires_grad=True)
    old = torch.tensor([[-LN2, LN2], [LN2, 0.0]], **F64)
    mask = torch.tensor([[True, True], [True, False]])
    scalar, out = gmpo_scalar(GMPO(clip_low=0.5, clip_high=0.5), log_probs, old, torch.tensor([2.0, -1.0], **F64), mask)
    r0, r1 = math.exp((0.5 - LN2) / 2), math.exp(-0.5)
    assert scalar.item() == pytest.approx((-2 * r0 + r1) / 2)
    assert_close(out.loss, torch.tensor([[-2 * r0, -2 * r0], [r1, 0.0]], **F64))
    assert_close(out.ratio, torch.tensor([[r0, r0], [r1, r1]], **F64))
    (grad,) = torch.autograd.grad(scalar, log_probs)
    assert_close(grad, torch.tensor([[0.0, -r0 / 2], [0.0, 0.0]], **F64))
    stats = out.stats  # clips that bite: row 0's first token (high), row 1's token (low), of 3 tokens
    assert stats["clip_frac_high"].item() == pytest.approx(1 / 3)
    assert stats["clip_frac_low"].item() == pytest.approx(1 / 3)


def test_on_policy_gmpo_is_the_sequence_mean_policy_gradient():
    # every ratio 1: l_i = -A_i, gradient -A_i / |y_i| per token, as the policy gradient under seq-mean-token-mean
    log_probs, _, _, advantages, mask = random_batch(0)
    value, grad = value_and_grad(gmpo_scalar(GMPO(), log_probs, None, advantages, mask)[0], log_probs)
    expected = value_and_grad(aggregate_loss(-advantages[:, None] * log_probs * mask, mask, MODE), log_probs)
    assert_close(value, -advantages.mean().detach(), **TOL)
    assert_close(grad, expected[1], **TOL)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("token_advantages", [False, True])
def test_gmpo_matches_verl(seed, token_advantages):
    log_probs, old, _, advantages, mask = random_batch(seed)
    old = log_probs.detach() + 3.0 * (old - log_probs.detach())  # log-ratios up to ~1: both clips bite
    if token_advantages:
        advantages = torch.randn(log_probs.shape, generator=torch.Generator().manual_seed(seed), **F64)
    verl_advantages = advantages if token_advantages else advantages[:, None].expand(log_probs.shape)
    expected = verl_geo_mean_loss(old, log_probs, verl_advantages, mask.double(), 0.3, 0.4)
    scalar, out = gmpo_scalar(GMPO(clip_low=0.3, clip_high=0.4), log_probs, old, advantages, mask)
    assert out.stats["clip_frac_high"] + out.stats["clip_frac_low"] > 0  # a clip bites
    assert_close(value_and_grad(scalar, log_probs), value_and_grad(expected, log_probs), **TOL)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("is_mode", ["token_truncate", "token_mask", "sequence_truncate"])
def test_gmpo_rollout_is_matches_verl(seed, is_mode):
    # verl multiplies each response's loss by the geometric mean of its tokens' weights (a sequence mode's weight
    # broadcast over the row: itself)
    log_probs, old, sampler, advantages, mask = random_batch(seed)
    weights = rollout_is_weights(old, sampler, mask, is_mode, max_weight=1.1, min_weight=0.9)
    verl_weights = weights.expand(log_probs.shape)
    expected = verl_geo_mean_loss(old, log_probs, advantages[:, None].expand(log_probs.shape), mask.double(),
                                  0.4, 0.4, verl_weights)  # fmt: skip
    scalar, _ = gmpo_scalar(GMPO(), log_probs, old, advantages, mask, weights)
    assert_close(value_and_grad(scalar, log_probs), value_and_grad(expected, log_probs), **TOL)
    plain, _ = gmpo_scalar(GMPO(), log_probs, old, advantages, mask)
    assert not torch.allclose(scalar, plain)  # the weights changed the loss


def test_gmpo_defaults_checks_and_shorthand():
    assert vars(policy_loss("gmpo")) == {"clip_low": 0.4, "clip_high": 0.4}
    GMPO().check(MODE)
    with pytest.raises(ValueError, match="GMPO's objective is the mean of each response's loss.*seq-mean-token-mean"):
        GMPO().check("token-mean")
    with pytest.raises(ValueError, match="GMPO: clip_high must be >= 0, got -0.1"):
        GMPO(clip_high=-0.1)

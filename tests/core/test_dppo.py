"""DPPO against hand-computed examples and against verl's own losses restated line by line (values and gradients
within 1e-6 in float64)."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.aggregation import aggregate_loss
from rlvr_lightning.core.importance_sampling import rollout_is_weights
from rlvr_lightning.core.losses.policy_losses import DPPO, policy_loss
from tests.core.test_losses_against_trl import F64, TOL, random_batch, value_and_grad
from tests.core.verl_restated import verl_agg_loss, verl_dppo_token_losses

# four tokens, old probabilities and new ones, and the sign of each advantage:
#   a: A = +1, 0.5 -> 0.7    rose by 0.2 > 0.15: out of the region on its advantage's side
#   b: A = +1, 0.01 -> 0.05  ratio 5 (PPO would clip it at 1.2), but it rose by only 0.04: kept, weight 5
#   c: A = -1, 0.5 -> 0.3    fell by 0.2 > 0.15: out
#   d: A = -1, 0.5 -> 0.7    rose against its advantage: kept, weight 1.4
OLD = [0.5, 0.01, 0.5, 0.5]
NEW = [0.7, 0.05, 0.3, 0.7]
ADV = [1.0, 1.0, -1.0, -1.0]


def hand_batch():
    log_probs = torch.tensor([NEW], **F64).log().requires_grad_()
    return log_probs, torch.tensor([OLD], **F64).log(), torch.tensor([ADV], **F64)


def test_dppo_tv_by_hand():
    log_probs, old, adv = hand_batch()
    out = DPPO("tv")(log_probs, old, adv, None)
    # l = -A sg[r] log p on b and d, 0 on a and c
    expected = [0.0, -5.0 * math.log(0.05), 0.0, 1.4 * math.log(0.7)]
    assert_close(out.loss, torch.tensor([expected], **F64))
    (grad,) = torch.autograd.grad(out.loss.sum(), log_probs)
    assert_close(grad, torch.tensor([[0.0, -5.0, 0.0, 1.4]], **F64))
    assert out.stats["clip_frac_high"].item() == pytest.approx(0.25)  # a
    assert out.stats["clip_frac_low"].item() == pytest.approx(0.25)  # c


def test_dppo_kl_by_hand():
    # binary KL of a: 0.5 ln(0.5 / 0.7) + 0.5 ln(0.5 / 0.3) = 0.0872 > 0.05: out; of b: 0.01 ln(0.01 / 0.05)
    # + 0.99 ln(0.99 / 0.95) = 0.0247: kept; c: 0.0872, out; d moved against its advantage: kept
    kl = [0.5 * math.log(0.5 / 0.7) + 0.5 * math.log(0.5 / 0.3), 0.01 * math.log(0.2) + 0.99 * math.log(0.99 / 0.95)]
    assert kl[0] == pytest.approx(0.0872, abs=1e-4) and kl[1] == pytest.approx(0.0247, abs=1e-4)
    log_probs, old, adv = hand_batch()
    out = DPPO("kl")(log_probs, old, adv, None)
    (grad,) = torch.autograd.grad(out.loss.sum(), log_probs)
    assert_close(grad, torch.tensor([[0.0, -5.0, 0.0, 1.4]], **F64))
    # a threshold above a's divergence keeps it
    (grad,) = torch.autograd.grad(DPPO("kl", clip_high=0.09)(log_probs, old, adv, None).loss.sum(), log_probs)
    assert_close(grad, torch.tensor([[-1.4, -5.0, 0.0, 1.4]], **F64))


def test_dppo_truncates_the_weight():
    log_probs, old, adv = hand_batch()
    (grad,) = torch.autograd.grad(DPPO("tv", max_ratio=2.0)(log_probs, old, adv, None).loss.sum(), log_probs)
    assert_close(grad, torch.tensor([[0.0, -2.0, 0.0, 1.4]], **F64))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("divergence", ["tv", "kl"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum"])
def test_dppo_matches_verl(seed, divergence, mode):
    log_probs, old, _, advantages, mask = random_batch(seed)
    old = log_probs.detach() + 4.0 * (old - log_probs.detach())  # moves large enough to leave the region
    advantages = torch.randn(log_probs.shape, generator=torch.Generator().manual_seed(seed), **F64)
    low, high = (0.1, 0.12) if divergence == "tv" else (0.03, 0.04)
    loss = DPPO(divergence, clip_low=low, clip_high=high, max_ratio=3.0)
    out = loss(log_probs, old, advantages, mask)
    assert out.stats["clip_frac_high"] > 0 and out.stats["clip_frac_low"] > 0  # both sides leave the region
    expected = verl_dppo_token_losses(old, log_probs, advantages, divergence, low, high, clip_ratio_c=3.0)
    expected = verl_agg_loss(expected, mask.double(), mode)
    ours = aggregate_loss(out.loss, mask, mode)
    assert_close(value_and_grad(ours, log_probs), value_and_grad(expected, log_probs), **TOL)


@pytest.mark.parametrize("is_mode", ["token_truncate", "sequence_mask"])
def test_dppo_rollout_is_matches_verl(is_mode):
    log_probs, old, sampler, advantages, mask = random_batch(1)
    weights = rollout_is_weights(old, sampler, mask, is_mode, max_weight=1.1, min_weight=0.9)
    out = DPPO().with_rollout_is(log_probs, old, advantages, mask, weights)
    adv = advantages[:, None].expand(log_probs.shape)
    expected = verl_dppo_token_losses(old, log_probs, adv, "tv", 0.15, 0.15, rollout_is_weights=weights)
    expected = verl_agg_loss(expected, mask.double(), "token-mean")
    ours = aggregate_loss(out.loss, mask, "token-mean")
    assert_close(value_and_grad(ours, log_probs), value_and_grad(expected, log_probs), **TOL)


def test_dppo_defaults_and_bad_options():
    assert vars(policy_loss("dppo")) == {"divergence": "tv", "clip_low": 0.15, "clip_high": 0.15, "max_ratio": 20.0}
    assert (DPPO("kl").clip_low, DPPO("kl").clip_high) == (0.05, 0.05)
    assert (DPPO("kl", clip_high=0.1).clip_low, DPPO("kl", clip_high=0.1).clip_high) == (0.05, 0.1)
    with pytest.raises(ValueError, match=r"DPPO: divergence='js' is not valid; choose one of \['tv', 'kl'\]"):
        DPPO("js")
    with pytest.raises(ValueError, match="DPPO: clip_low must be >= 0, got -0.1"):
        DPPO(clip_low=-0.1)
    with pytest.raises(ValueError, match="DPPO: max_ratio must be > 0, got 0"):
        DPPO(max_ratio=0)

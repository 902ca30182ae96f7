"""GPPO (gradient-preserving clipping) by hand and against the Klear-Reasoner code, restated."""

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.aggregation import aggregate_loss
from rlvr_lightning.core.losses.policy_losses import GPPO, PPOClip, policy_loss


def _grad(loss_fn, log_probs, old, adv):
    log_probs = log_probs.clone().requires_grad_()
    out = loss_fn(log_probs, old, adv, None)
    out.loss.sum().backward()
    return out, log_probs.grad


def test_clipped_tokens_keep_a_bounded_gradient():
    # token 0: A = +1, r = 1.5 > 1.28 -> PPO: loss -1.28, no gradient; GPPO: the same value, gradient -1.28
    # token 1: A = -1, r = 0.5 < 0.8 -> PPO: loss 0.8, no gradient; GPPO: the same value, gradient 0.8 (x beta_low)
    # token 2: A = +1, r = 1.1, inside the range -> -r A for both, gradient -1.1
    log_probs = torch.log(torch.tensor([[1.5, 0.5, 1.1]]))
    old = torch.zeros(1, 3)
    adv = torch.tensor([[1.0, -1.0, 1.0]])
    ppo, ppo_grad = _grad(PPOClip(0.2, 0.28), log_probs, old, adv)
    gppo, gppo_grad = _grad(GPPO(0.2, 0.28), log_probs, old, adv)
    assert_close(gppo.loss.detach(), ppo.loss.detach())
    assert_close(ppo_grad, torch.tensor([[0.0, 0.0, -1.1]]))
    assert_close(gppo_grad, torch.tensor([[-1.28, 0.8, -1.1]]))
    scaled, scaled_grad = _grad(GPPO(0.2, 0.28, beta_low=0.25, beta_high=0.5), log_probs, old, adv)
    assert_close(scaled.loss.detach(), torch.tensor([[-0.64, 0.2, -1.1]]))
    assert_close(scaled_grad, torch.tensor([[-0.64, 0.2, -1.1]]))
    # the statistics count the clipped tokens as PPO's do
    assert gppo.stats["clip_frac_high"].item() == pytest.approx(1 / 3)
    assert gppo.stats["clip_frac_low"].item() == pytest.approx(1 / 3)


def test_dual_clip_bounds_a_negative_advantage_with_a_huge_ratio():
    # A = -1, r = 5 > c = 3: the loss is -A c = 3, with no gradient (as PPOClip's dual clip)
    out, grad = _grad(
        GPPO(0.2, 0.28, dual_clip=3.0), torch.log(torch.tensor([[5.0]])), torch.zeros(1, 1), -torch.ones(1, 1)
    )
    assert out.loss.item() == pytest.approx(3.0)
    assert grad.item() == 0.0
    assert out.stats["dual_clip_frac"].item() == 1.0


def _klear_gppo(old_log_prob, log_prob, advantages, response_mask, cliprange_low, cliprange_high, clip_ratio_c):
    """Kwai-Klear/KlearReasoner 3422f6d, verl/trainer/ppo/core_algos.py ``compute_gppo_loss`` (``only_high=False``;
    its ``only_high`` branch reads an undefined name ``only_higher``), restated; token-mean aggregation."""
    ratio = torch.exp(log_prob - old_log_prob)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(
        ratio, (1 - cliprange_low) / ratio.detach() * ratio, (1 + cliprange_high) / ratio.detach() * ratio
    )
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    return (pg_losses * response_mask).sum() / response_mask.sum()


def _klear_gppo_general(old_log_prob, log_prob, advantages, response_mask, low, high, clip_ratio_c, beta1, beta2):
    """The same file's ``compute_gppo_loss_general_beta`` (CE-GPPO's beta1, beta2), restated."""
    ratio = torch.exp(log_prob - old_log_prob)
    ratio_detached = ratio.detach()
    low_mask = (ratio < (1 - low)) & (advantages < 0)
    high_mask = (ratio > (1 + high)) & (advantages > 0)
    other_mask = ~(low_mask | high_mask)
    clip_pg_losses1 = torch.zeros_like(advantages)
    clip_pg_losses1[low_mask] = -beta1 * (1 - low) / ratio_detached[low_mask] * ratio[low_mask] * advantages[low_mask]
    clip_pg_losses1[high_mask] = (
        -beta2 * (1 + high) / ratio_detached[high_mask] * ratio[high_mask] * advantages[high_mask]
    )
    clip_pg_losses1[other_mask] = -ratio[other_mask] * advantages[other_mask]
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    return (pg_losses * response_mask).sum() / response_mask.sum()


def _inputs(seed):
    generator = torch.Generator().manual_seed(seed)
    log_probs = torch.randn(6, 9, generator=generator, dtype=torch.float64).log_softmax(-1)
    old = log_probs + 0.6 * torch.randn(6, 9, generator=generator, dtype=torch.float64)
    lengths = torch.randint(1, 10, (6,), generator=generator)
    mask = (torch.arange(9) < lengths[:, None]).double()
    adv = torch.randn(6, 9, generator=generator, dtype=torch.float64)
    return log_probs, old, adv, mask


@pytest.mark.parametrize("seed", range(4))
def test_gppo_equals_the_klear_code(seed):
    log_probs, old, adv, mask = _inputs(seed)
    ours_in = log_probs.clone().requires_grad_()
    ours = aggregate_loss(GPPO(0.2, 0.28, dual_clip=3.0)(ours_in, old, adv, mask).loss, mask, "token-mean")
    theirs_in = log_probs.clone().requires_grad_()
    theirs = _klear_gppo(old, theirs_in, adv, mask, 0.2, 0.28, 3.0)
    assert_close(ours, theirs)
    assert_close(torch.autograd.grad(ours, ours_in)[0], torch.autograd.grad(theirs, theirs_in)[0])


@pytest.mark.parametrize("betas", [(0.25, 1.0), (0.5, 0.75)])
@pytest.mark.parametrize("seed", range(3))
def test_gppo_with_betas_equals_the_klear_general_code(seed, betas):
    log_probs, old, adv, mask = _inputs(seed)
    ours_in = log_probs.clone().requires_grad_()
    loss = GPPO(0.2, 0.28, dual_clip=10.0, beta_low=betas[0], beta_high=betas[1])
    ours = aggregate_loss(loss(ours_in, old, adv, mask).loss, mask, "token-mean")
    theirs_in = log_probs.clone().requires_grad_()
    theirs = _klear_gppo_general(old, theirs_in, adv, mask, 0.2, 0.28, 10.0, *betas)
    assert_close(ours, theirs)
    assert_close(torch.autograd.grad(ours, ours_in)[0], torch.autograd.grad(theirs, theirs_in)[0])


def test_gppo_is_a_shorthand_and_checks_its_options():
    assert isinstance(policy_loss("gppo"), GPPO)
    with pytest.raises(ValueError, match="GPPO: beta_low must be >= 0"):
        GPPO(beta_low=-1.0)

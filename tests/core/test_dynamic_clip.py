"""DCPO's dynamic-adaptive clipping (arXiv:2509.02333): the bounds by hand, a rare token's gradient
where PPO's clip drops it, and equal to the authors' `compute_policy_loss_dcpo` (clip_type dynamic), restated."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.aggregation import aggregate_loss
from rlvr_lightning.core.losses.policy_losses import DynamicClip, PPOClip, policy_loss


def _grad(loss_fn, log_probs, old, adv):
    log_probs = log_probs.clone().requires_grad_()
    out = loss_fn(log_probs, old, adv, None)
    out.loss.sum().backward()
    return out, log_probs.grad


def test_the_bounds_by_hand():
    q = torch.tensor([0.9, 0.5, 0.01, 1e-4])
    lower, upper = DynamicClip(clip_low=0.2, clip_high=0.28).bounds(q.log())
    # lower: 1/2 + 1/2 sqrt(1 - 0.8/0.9) = 1/2 + 1/6; 1 - 0.8/q < 0 below q = 0.8: 1/2
    assert lower.tolist() == pytest.approx([0.5 + 0.5 / 3, 0.5, 0.5, 0.5], abs=1e-6)
    # upper: 1/2 + 1/2 sqrt(1 + 1.12/q), at most 10 (q = 1e-4 would give 53.4)
    expected = [0.5 + 0.5 * math.sqrt(1 + 1.12 / 0.9), 0.5 + 0.5 * math.sqrt(1 + 1.12 / 0.5)]
    expected += [0.5 + 0.5 * math.sqrt(1 + 112.0), 10.0]
    assert upper.tolist() == pytest.approx(expected, rel=1e-6)


def test_a_rare_token_keeps_its_gradient_where_ppos_clip_drops_it():
    # q = 0.01, r = 3, A = +1: PPO clips at 1.28 (no gradient); DCPO's bound is 5.82, so -A r with gradient -3
    old = torch.log(torch.tensor([[0.01, 0.9]]))
    log_probs = old + torch.log(torch.tensor([[3.0, 1.2]]))
    adv = torch.ones(1, 2)
    ppo, ppo_grad = _grad(PPOClip(0.2, 0.28), log_probs, old, adv)
    dcpo, dcpo_grad = _grad(DynamicClip(), log_probs, old, adv)
    assert_close(ppo_grad, torch.tensor([[0.0, -1.2]]))
    # the likely token (q = 0.9): its bound 0.5 + 0.5 sqrt(1 + 1.12 / 0.9) = 1.249 > 1.2, not clipped either
    assert_close(dcpo_grad, torch.tensor([[-3.0, -1.2]]))
    assert dcpo.stats["clip_frac_high"].item() == 0.0
    # r = 1.3 on the likely token is above its bound: clipped, as PPO's
    clipped, grad = _grad(DynamicClip(), old + torch.log(torch.tensor([[3.0, 1.3]])), old, adv)
    assert grad[0, 1].item() == 0.0
    assert clipped.loss[0, 1].item() == pytest.approx(-(0.5 + 0.5 * math.sqrt(1 + 1.12 / 0.9)), rel=1e-6)
    assert clipped.stats["clip_frac_high"].item() == pytest.approx(0.5)


def _authors_dcpo(old_log_prob, log_prob, advantages, response_mask, clip_low, clip_high, clip_ratio_c):
    """github.com/lime-RL/DCPO 01787b0, verl/trainer/ppo/core_algos.py ``get_clip_low_high`` and
    ``compute_policy_loss_dcpo`` (``clip_type: dynamic``), restated; token-mean aggregation."""
    ref_prob = torch.exp(old_log_prob)
    low_c_ref = 1 - torch.where(ref_prob != 0, 4 * clip_low / ref_prob, 0)
    low_c_ref = low_c_ref * (low_c_ref >= 0)
    high_c_ref = torch.where(ref_prob != 0, 1 + 4 * clip_high / ref_prob, float("inf"))
    low, high = (1 + torch.sqrt(low_c_ref)) / 2, torch.clamp((1 + torch.sqrt(high_c_ref)) / 2, 0, max(clip_ratio_c, 10))
    ratio = torch.exp(log_prob - old_log_prob)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, low, high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    clip_pg_losses2 = torch.min(-advantages * clip_ratio_c, clip_pg_losses1)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    return (pg_losses * response_mask).sum() / response_mask.sum()


@pytest.mark.parametrize("clip_ratio_c", [3.0, 10.0])
def test_equals_the_authors_loss_and_gradient_on_random_batches(clip_ratio_c):
    generator = torch.Generator().manual_seed(0)
    loss_fn = DynamicClip(clip_low=0.2, clip_high=0.28, max_ratio=10.0, dual_clip=clip_ratio_c)
    for _ in range(200):
        n, t = torch.randint(1, 6, (2,), generator=generator).tolist()
        old = torch.log(torch.rand(n, t, generator=generator).clamp_min(1e-4))
        log_probs = (old + 1.5 * torch.randn(n, t, generator=generator)).clamp_max(0.0)
        adv = torch.randn(n, 1, generator=generator).expand(n, t)
        mask = (torch.rand(n, t, generator=generator) < 0.8).float()
        mask[0, 0] = 1.0
        ours_lp, theirs_lp = log_probs.clone().requires_grad_(), log_probs.clone().requires_grad_()
        out = loss_fn(ours_lp, old, adv, mask)
        ours = aggregate_loss(out.loss, mask, "token-mean")
        theirs = _authors_dcpo(old, theirs_lp, adv, mask, 0.2, 0.28, clip_ratio_c)
        ours.backward()
        theirs.backward()
        assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
        assert_close(ours_lp.grad, theirs_lp.grad, rtol=1e-5, atol=1e-6)


def test_shorthand_and_bad_options():
    loss = policy_loss("dynamic_clip")
    assert isinstance(loss, DynamicClip)
    assert (loss.clip_low, loss.clip_high, loss.max_ratio, loss.dual_clip) == (0.2, 0.28, 10.0, 10.0)
    with pytest.raises(ValueError, match="max_ratio must be > 1"):
        DynamicClip(max_ratio=1.0)
    with pytest.raises(ValueError, match="clip_low must be >= 0"):
        DynamicClip(clip_low=-0.1)

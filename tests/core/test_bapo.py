"""BAPO (arXiv:2510.18927): the bound search by hand in both orders, the probability weighting of eq. 8, the loss as
PPO's clip at the bounds found, and equal to the authors' `compute_policy_loss_bapo`, restated."""

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.aggregation import aggregate_loss
from rlvr_lightning.core.losses.balanced_clip import balanced_bounds, positive_share
from rlvr_lightning.core.losses.policy_losses import BAPO, PPOClip, policy_loss

# one positive token at r = 1.5, two negative ones at r = 0.5 and 1.0, every advantage of size 1
RATIO, ADV, ONES = torch.tensor([1.5, 0.5, 1.0]), torch.tensor([1.0, -1.0, -1.0]), torch.ones(3)
PAPER = dict(lower=(0.6, 0.9), upper=(1.2, 3.0), lower_step=0.02, upper_step=0.05)


def test_the_positive_share_by_hand():
    # min(1.5, 1.2) = 1.2 against max(0.5, 0.6) + max(1.0, 0.6) = 1.6: 1.2 / 2.8
    assert positive_share(RATIO, ADV, ONES, 0.6, 1.2) == pytest.approx(1.2 / 2.8)
    assert positive_share(RATIO, ADV, torch.tensor([1.0, 0.5, 0.5]), 0.6, 1.2) == pytest.approx(1.2 / 2.0)
    assert positive_share(RATIO, -ADV.abs(), ONES, 0.6, 1.2) == 0.0
    assert positive_share(RATIO, torch.zeros(3), ONES, 0.6, 1.2) == 1.0  # nothing to balance


def test_the_search_by_hand_in_both_orders():
    # upper first: c_high 1.25 -> 1.25 / 2.85 = 0.4386, 1.30 -> 0.4483, 1.35 -> 1.35 / 2.95 = 0.4576 >= 0.45
    low, high, share = balanced_bounds(RATIO, ADV, ONES, 0.45, raise_first="upper", **PAPER)
    assert (low, high, share) == pytest.approx((0.6, 1.35, 1.35 / 2.95))
    # lower first: c_low up to 0.9 only adds to the negative side (1.2 / 3.1); then c_high to 3.0, where the
    # positive token gives all it has: 1.5 / (1.5 + 0.9 + 1.0) = 0.441 < 0.45
    low, high, share = balanced_bounds(RATIO, ADV, ONES, 0.45, raise_first="lower", **PAPER)
    assert (low, high, share) == pytest.approx((0.9, 3.0, 1.5 / 3.4))
    # already balanced: the bounds stay at the ranges' starts
    assert balanced_bounds(RATIO, ADV, ONES, 0.4, **PAPER)[:2] == (0.6, 1.2)
    # a step that would pass a range's end stops at it: 1.2 + 0.5 -> 1.6 (1.5 / 3.1 = 0.484 < 0.49), then c_low
    low, high, _ = balanced_bounds(RATIO, ADV, ONES, 0.49, (0.6, 0.9), (1.2, 1.6), 0.02, 0.5)
    assert (low, high) == pytest.approx((0.9, 1.6))


def test_eq_8_weighs_each_token_by_its_probability_when_sampled():
    # the negative tokens sampled at probability 0.1, the positive one at 1: 1.2 / (1.2 + 0.16) = 0.88 from the start
    weight = torch.tensor([1.0, 0.1, 0.1])
    assert balanced_bounds(RATIO, ADV, weight, 0.45, **PAPER)[:2] == (0.6, 1.2)
    old = weight.log().unsqueeze(0)
    log_probs = old + RATIO.log().unsqueeze(0)
    assert BAPO(target=0.45).bounds(log_probs[0], old[0], ADV)[:2] == pytest.approx((0.6, 1.2))
    assert BAPO(target=0.45, probability_weighted=False).bounds(log_probs[0], old[0], ADV)[:2] == pytest.approx(
        (0.6, 1.35)
    )


def test_the_loss_is_ppos_clip_at_the_bounds_found():
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    log_probs = (old + RATIO.log()).requires_grad_()
    reference = log_probs.detach().clone().requires_grad_()
    bapo = BAPO(target=0.45, probability_weighted=False)
    out = bapo(log_probs, old, ADV.unsqueeze(0), None)
    ppo = PPOClip(clip_low=0.4, clip_high=0.35)(reference, old, ADV.unsqueeze(0), None)  # [0.6, 1.35]
    assert_close(out.loss, ppo.loss)
    out.loss.sum().backward()
    ppo.loss.sum().backward()
    assert_close(log_probs.grad, reference.grad)
    # r = 1.5 > 1.35 (A > 0) and r = 0.5 < 0.6 (A < 0) are clipped: no gradient; r = 1.0, A = -1: d(r)/d log p = 1
    assert log_probs.grad[0].tolist() == pytest.approx([0.0, 0.0, 1.0])
    assert out.loss.detach()[0].tolist() == pytest.approx([-1.35, 0.6, 1.0])
    stats = out.stats
    assert (stats["bapo_clip_low"].item(), stats["bapo_clip_high"].item()) == pytest.approx((0.6, 1.35))
    assert stats["bapo_positive_share"].item() == pytest.approx(1.35 / 2.95)
    assert stats["clip_frac_high"].item() == pytest.approx(1 / 3)


def _authors_bapo(old_log_prob, log_prob, advantages, response_mask, target, low, low_max, high, high_max, step):
    """github.com/WooooDyy/BAPO 3b8389c, recipe/bapo/policy_loss.py ``_compute_effective_advantage`` and
    ``compute_policy_loss_bapo`` (one process; verl's ``clip_ratio_c`` 3), restated; token-mean aggregation."""
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))

    def pos_neg_ratio(clip_low, clip_high):
        effective = torch.where(advantages >= 0, torch.minimum(ratio, torch.tensor(clip_high)), ratio)
        effective = torch.where(advantages < 0, torch.maximum(ratio, torch.tensor(clip_low)), effective)
        effective_adv = effective * advantages * response_mask
        pos, neg = effective_adv.clamp(min=0).sum(), (-effective_adv.clamp(max=0)).sum()
        return float("inf") if neg <= 0 else (pos / (neg + 1e-8)).item()

    current = pos_neg_ratio(low, high)
    while current < target and low < low_max:
        low = min(low + step, low_max)
        current = pos_neg_ratio(low, high)
    while current < target and high < high_max:
        high = min(high + step, high_max)
        current = pos_neg_ratio(low, high)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, low, high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    clip_pg_losses2 = torch.min(-advantages * 3.0, clip_pg_losses1)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    return (pg_losses * response_mask).sum() / response_mask.sum(), (low, high)


def test_equals_the_authors_loss_and_gradient_on_random_batches():
    generator = torch.Generator().manual_seed(0)
    # the authors' bapo_trainer.yaml: pos/neg >= 1 (a positive share of 1/2), [0.6, 0.8], [1.2, 2.0], steps 0.05
    loss_fn = BAPO(
        target=0.5,
        lower=(0.6, 0.8),
        upper=(1.2, 2.0),
        lower_step=0.05,
        upper_step=0.05,
        raise_first="lower",
        probability_weighted=False,
        dual_clip=3.0,
    )
    seen = set()
    for _ in range(200):
        n, t = torch.randint(1, 8, (2,), generator=generator).tolist()
        old = torch.log(torch.rand(n, t, generator=generator).clamp_min(1e-4))
        log_probs = (old + 0.8 * torch.randn(n, t, generator=generator)).clamp_max(0.0)
        adv = (torch.randn(n, 1, generator=generator) - 0.3).expand(n, t)  # mostly negative, as early in a run
        mask = (torch.rand(n, t, generator=generator) < 0.8).float()
        mask[0, 0] = 1.0
        ours_lp, theirs_lp = log_probs.clone().requires_grad_(), log_probs.clone().requires_grad_()
        out = loss_fn(ours_lp, old, adv, mask)
        ours = aggregate_loss(out.loss, mask, "token-mean")
        theirs, bounds = _authors_bapo(old, theirs_lp, adv, mask, 1.0, 0.6, 0.8, 1.2, 2.0, 0.05)
        assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
        ours.backward()
        theirs.backward()
        assert_close(ours_lp.grad, theirs_lp.grad, rtol=1e-6, atol=1e-7)
        stats = out.stats
        found = (stats["bapo_clip_low"].item(), stats["bapo_clip_high"].item())
        real = mask.bool()
        if bool((adv < 0)[real].any()) and bool((adv >= 0)[real].any()):
            assert found == pytest.approx(bounds)
        seen.add(tuple(round(b, 2) for b in bounds))
    assert {(0.6, 1.2), (0.8, 2.0)} < seen  # at the starts, at the ends, and between


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(lower=(0.9, 0.6)), "0 < lower\\[0\\] <= lower\\[1\\] <= 1 <= upper\\[0\\] <= upper\\[1\\]"),
        (dict(upper=(0.9, 2.0)), "upper=\\[0.9, 2.0\\]"),
        (dict(target=1.5), "target must be in \\[0, 1\\], got 1.5"),
        (dict(raise_first="both"), "raise_first='both' is not valid; choose one of \\['upper', 'lower'\\]"),
        (dict(dual_clip=0.5), "dual_clip must be > 1"),
        (dict(upper_step=-0.1), "steps must be >= 0"),
    ],
)
def test_bad_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        BAPO(**options)


def test_the_shorthand():
    assert type(policy_loss("bapo")) is BAPO

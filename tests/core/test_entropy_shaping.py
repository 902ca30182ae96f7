"""`EntropyShapedAdvantage` (Cheng et al. 2025, arXiv:2506.14758 §3.2): a hand example, the paper's own code line
restated, the bounds that keep an advantage's sign, detached entropies and padding."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core import EntropyShapedAdvantage, PolicyGradient, PPOClip, policy_loss
from rlvr_lightning.core.losses.entropy_shaping import entropy_advantage_bonus
from rlvr_lightning.core.losses.token_selection import HighEntropyTokens, pick_tokens


def test_a_hand_computed_example():
    # A = 1 and -1; alpha 0.4, kappa 2: psi = min(0.4 H, |A| / 2) = min(0.4 H, 0.5)
    log_probs = torch.log(torch.tensor([[0.5, 0.25, 0.8], [0.1, 0.6, 0.3]])).requires_grad_()
    entropy = torch.tensor([[0.5, 2.0, 0.1], [3.0, 0.2, 1.0]])
    out = EntropyShapedAdvantage(PolicyGradient(), alpha=0.4, kappa=2.0)(
        log_probs, None, torch.tensor([1.0, -1.0]), None, entropy=entropy
    )
    # shaped: 1 + [0.2, 0.5, 0.04] = [1.2, 1.5, 1.04]; -1 + [0.5, 0.08, 0.4] = [-0.5, -0.92, -0.6]
    shaped = torch.tensor([[1.2, 1.5, 1.04], [-0.5, -0.92, -0.6]])
    assert_close(out.loss, -shaped * log_probs.detach())
    out.loss.sum().backward()
    assert_close(log_probs.grad, -shaped)
    # the logged bonus: the mean of 0.2, 0.5, 0.04, 0.5, 0.08, 0.4 = 1.72 / 6
    assert out.extra_stats["entropy_bonus"].item() == pytest.approx(1.72 / 6)


def paper_line(adv: torch.Tensor, entropy: torch.Tensor, alpha: float, kappa: float) -> torch.Tensor:
    """The paper's inserted line, as printed in §3.2 (adv [N, T] from GRPO or PPO)."""
    adv = adv.clone()
    adv += torch.min(alpha * entropy.detach(), adv.abs() / kappa)
    return adv


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("alpha,kappa", [(0.4, 2.0), (0.1, 2.0), (1.5, 1.25)])
def test_equals_the_inner_loss_on_the_papers_shaped_advantages(seed, alpha, kappa):
    g = torch.Generator().manual_seed(seed)
    log_probs = (-torch.rand(4, 6, generator=g) * 3).requires_grad_()
    old = log_probs.detach() + 0.3 * torch.randn(4, 6, generator=g)
    adv = torch.randn(4, generator=g)
    entropy = torch.rand(4, 6, generator=g) * 3
    mask = torch.rand(4, 6, generator=g) > 0.25
    inner = PPOClip(clip_low=0.2, clip_high=0.28)
    ours = EntropyShapedAdvantage(inner, alpha, kappa)(log_probs, old, adv, mask, entropy=entropy)
    (grad_ours,) = torch.autograd.grad(ours.loss.sum(), log_probs)
    expected = inner(log_probs, old, paper_line(adv[:, None].expand(4, 6), entropy, alpha, kappa), mask)
    (grad_expected,) = torch.autograd.grad(expected.loss.sum(), log_probs)
    assert_close(ours.loss, expected.loss)
    assert_close(grad_ours, grad_expected)
    for key, value in expected.stats.items():
        assert_close(ours.stats[key], value, msg=key)


def test_the_bonus_never_flips_an_advantage_and_is_zero_where_it_is():
    g = torch.Generator().manual_seed(3)
    adv = torch.cat([torch.randn(200, generator=g) * 3, torch.zeros(10)])[:, None].expand(210, 5)
    entropy = torch.rand(210, 5, generator=g) * 10
    shaped = adv + entropy_advantage_bonus(adv, entropy, alpha=0.4, kappa=2.0)
    assert (shaped[adv > 0] >= adv[adv > 0]).all()
    negative = adv < 0
    assert (shaped[negative] < 0).all() and (shaped[negative] >= adv[negative]).all()
    assert (shaped[adv == 0] == 0).all()
    assert (shaped - adv <= 0.4 * entropy + 1e-6).all()  # the bonus is at most alpha H


def test_no_gradient_reaches_the_entropy():
    log_probs = torch.tensor([[-0.5, -1.0]], requires_grad=True)
    entropy = torch.tensor([[0.3, 0.7]], requires_grad=True)
    out = EntropyShapedAdvantage(PolicyGradient())(log_probs, None, torch.tensor([2.0]), None, entropy=entropy)
    out.loss.sum().backward()
    assert entropy.grad is None
    assert_close(log_probs.grad, -(2.0 + 0.4 * entropy.detach()))


def test_padding_with_a_non_finite_entropy_stays_out_of_loss_and_gradient():
    log_probs = torch.tensor([[-0.5, -1.0, 0.0]], requires_grad=True)
    entropy = torch.tensor([[0.3, 0.7, math.nan]])
    mask = torch.tensor([[True, True, False]])
    out = EntropyShapedAdvantage(PPOClip())(log_probs, None, torch.tensor([-1.0]), mask, entropy=entropy)
    out.loss.sum().backward()
    assert out.loss[0, 2] == 0 and torch.isfinite(out.loss).all() and torch.isfinite(log_probs.grad).all()
    assert out.extra_stats["entropy_bonus"].item() == pytest.approx((0.12 + 0.28) / 2)


def test_the_sampler_correction_is_the_inner_losses_on_the_shaped_advantages():
    g = torch.Generator().manual_seed(4)
    log_probs = -torch.rand(3, 4, generator=g)
    old = log_probs + 0.2 * torch.randn(3, 4, generator=g)
    adv, entropy, weights = torch.randn(3, generator=g), torch.rand(3, 4, generator=g), torch.rand(3, 4, generator=g)
    shaped = paper_line(adv[:, None].expand(3, 4), entropy, 0.1, 2.0)
    ours = EntropyShapedAdvantage("ppo_clip", alpha=0.1).with_rollout_is(
        log_probs, old, adv, None, weights, entropy=entropy
    )
    assert_close(ours.loss, PPOClip().with_rollout_is(log_probs, old, shaped, None, weights).loss)


def test_bad_options_and_a_missing_entropy_are_refused():
    with pytest.raises(ValueError, match="kappa must be > 1"):
        EntropyShapedAdvantage(kappa=1.0)
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        EntropyShapedAdvantage(alpha=-0.1)
    with pytest.raises(ValueError, match="picks tokens"):
        EntropyShapedAdvantage(HighEntropyTokens())
    with pytest.raises(ValueError, match="pass entropy="):
        EntropyShapedAdvantage()(torch.zeros(1, 2), None, torch.ones(1), None)
    shorthand = policy_loss("entropy_shaped")
    assert isinstance(shorthand, EntropyShapedAdvantage) and (shorthand.alpha, shorthand.kappa) == (0.4, 2.0)
    assert shorthand.reads_entropy and not PolicyGradient.reads_entropy


def test_under_high_entropy_token_selection_the_picked_tokens_train_on_shaped_advantages():
    g = torch.Generator().manual_seed(5)
    log_probs = -torch.rand(3, 5, generator=g)
    old = log_probs + 0.2 * torch.randn(3, 5, generator=g)
    adv, entropy = torch.randn(3, generator=g), torch.rand(3, 5, generator=g) * 2
    shaped = EntropyShapedAdvantage(PPOClip(), alpha=0.4)
    both = HighEntropyTokens(shaped, top_quantile=0.4)
    assert both.reads_entropy and both.selection_reads_entropy
    selected = pick_tokens(both, log_probs, old, adv, None, entropy)
    out = both(log_probs, old, adv, None, selected=selected, entropy=entropy)
    alone = shaped(log_probs, old, adv, None, entropy=entropy)
    assert_close(out.loss, alone.loss.masked_fill(~selected, 0.0))
    assert 0 < selected.sum() < selected.numel()
    weights = torch.rand(3, 5, generator=g)
    corrected = both.with_rollout_is(log_probs, old, adv, None, weights, selected=selected, entropy=entropy)
    assert_close(corrected.loss, (alone.loss * weights).masked_fill(~selected, 0.0))

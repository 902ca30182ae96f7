"""Archer (dual-token constraints, arXiv:2507.15778) and ASPO (arXiv:2510.06062) by hand and against the authors'
code, restated."""

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.aggregation import aggregate_loss
from rlvr_lightning.core.losses.entropy_clip import low_entropy_tokens
from rlvr_lightning.core.losses.policy_losses import ASPO, Archer, PPOClip

ENTROPY = torch.tensor([[0.1, 0.5, 2.0]])  # the 0.8-quantile: 0.5 + 0.6 x 1.5 = 1.4: tokens 0 and 1 are low-entropy


def test_the_knowledge_tokens_by_hand():
    assert low_entropy_tokens(ENTROPY, None, 0.8).tolist() == [[True, True, False]]
    mask = torch.tensor([[True, True, False]])  # the last token is padding: the quantile of (0.1, 0.5) is 0.42
    assert low_entropy_tokens(ENTROPY, mask, 0.8).tolist() == [[True, False, False]]
    assert not low_entropy_tokens(ENTROPY, torch.zeros_like(mask), 0.8).any()  # a response without tokens


def _run(loss, log_probs, old, adv, ref, entropy=ENTROPY, mask=None):
    log_probs = log_probs.clone().requires_grad_()
    mask = torch.ones_like(log_probs, dtype=torch.bool) if mask is None else mask
    out = loss(log_probs, old, adv, mask, entropy=entropy, ref_log_probs=ref)
    total = aggregate_loss(out.loss, mask, "seq-mean-token-mean")
    total.backward()
    return out, total.item(), log_probs.grad


def test_a_positive_response_by_hand():
    # pi_old = pi_ref = (0.5, 0.5, 0.2), r = (1.3, 0.9, 1.3): token 0 (low entropy, eps 0.2) clipped at 1.2, token 2
    # (high entropy, eps 0.5) not: pg = -(1.2 + 0.9 + 1.3) / 3; k3 of the low tokens (0.031595, 0.005751), mean
    # 0.018673, times 0.001; the gradient: 0.001/2 (1 - 0.5/0.65), -0.9/3 + 0.001/2 (1 - 0.5/0.45), -1.3/3
    old = torch.log(torch.tensor([[0.5, 0.5, 0.2]]))
    log_probs = torch.log(torch.tensor([[0.65, 0.45, 0.26]]))
    out, total, grad = _run(Archer(), log_probs, old, torch.tensor([1.0]), old)
    assert total == pytest.approx(-3.4 / 3 + 0.001 * 0.018673, abs=1e-6)
    assert_close(grad, torch.tensor([[1.1538e-4, -0.300056, -0.433333]]), atol=1e-6, rtol=0)
    _, _, ppo_grad = _run(lambda *a, **k: PPOClip(0.2)(*a[:4]), log_probs, old, torch.tensor([1.0]), old)
    assert ppo_grad[0, 2] == 0  # PPO's clip at 1.2 would have silenced the reasoning token
    assert out.stats["archer_low_entropy_frac"].item() == pytest.approx(2 / 3)
    assert out.stats["archer_kl"].item() == pytest.approx(0.018673, abs=1e-6)


def test_a_negative_response_by_hand():
    # r = (0.7, 1.1, 0.6), A = -1: token 0 clipped at 0.8 (no gradient), token 2 within 0.5 (gradient 0.6 / 3)
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    log_probs = old + torch.log(torch.tensor([[0.7, 1.1, 0.6]]))
    _, total, grad = _run(Archer(kl_coef=0.0), log_probs, old, torch.tensor([-1.0]), old)
    assert total == pytest.approx((0.8 + 1.1 + 0.6) / 3)
    assert_close(grad, torch.tensor([[0.0, 1.1 / 3, 0.6 / 3]]))


def _masked_mean(values, mask):
    return (values * mask).sum() / (mask.sum() + 1e-8)  # verl's verl_F.masked_mean


def authors_loss(log_prob, old_log_prob, ref_log_prob, advantages, entropy, response_mask, kl_coef, high_kl_coef):
    """wizard-III/ArcherCodeR 8a1785b restated, one response per micro-batch as the authors' scripts run it:
    dp_actor.py's entropy masks and KL terms, core_algos.compute_policy_loss (use_token_entropy_separate, 0.2 / 0.5,
    clip_ratio_c 10), kl_penalty low_var_kl; micro-batch losses averaged over the responses (gradient accumulation)."""
    total = 0.0
    for i in range(log_prob.shape[0]):
        lp, old, ref, adv, mask = log_prob[i], old_log_prob[i], ref_log_prob[i], advantages[i], response_mask[i]
        masked_entropy = torch.where(mask.bool(), entropy[i], torch.nan)
        q80 = torch.nanquantile(masked_entropy, q=0.8, dim=-1, keepdim=True)
        high_entropy_mask = (masked_entropy <= q80) & mask.bool()  # only low entropy token is True
        low_entropy_mask = (masked_entropy > q80) & mask.bool()  # only high entropy token is True
        ratio = torch.exp(torch.clamp(lp - old, min=-20.0, max=20.0))
        pg_losses1 = -adv * ratio
        clip_ratio = torch.where(high_entropy_mask, torch.clamp(ratio, 1 - 0.2, 1 + 0.2), torch.clamp(ratio, 0.5, 1.5))
        pg_losses2 = -adv * clip_ratio
        clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
        clip_pg_losses2 = torch.min(-adv * 10.0, clip_pg_losses1)
        pg_losses = torch.where(adv < 0, clip_pg_losses2, clip_pg_losses1)
        pg_loss = _masked_mean(pg_losses, mask)
        kl = torch.clamp(ref - lp, min=-20, max=20)
        kld = torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)
        policy_loss = pg_loss + _masked_mean(kld, high_entropy_mask) * kl_coef
        total = total + policy_loss + _masked_mean(kld, low_entropy_mask) * high_kl_coef
    return total / log_prob.shape[0]


@pytest.mark.parametrize("high_kl_coef", [0.0, 0.01])
def test_equals_the_authors_code(high_kl_coef):
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        rows, width = 4, int(torch.randint(1, 9, (1,), generator=g))
        lengths = torch.randint(1, width + 1, (rows,), generator=g)
        mask = torch.arange(width)[None] < lengths[:, None]
        old = -torch.rand(rows, width, generator=g, dtype=torch.float64) * 3
        log_probs = old + 0.6 * torch.randn(rows, width, generator=g, dtype=torch.float64)
        ref = old + 0.3 * torch.randn(rows, width, generator=g, dtype=torch.float64)
        adv = torch.randn(rows, generator=g, dtype=torch.float64)
        entropy = torch.rand(rows, width, generator=g, dtype=torch.float64) * 4
        theirs_lp = log_probs.clone().requires_grad_()
        theirs = authors_loss(theirs_lp, old, ref, adv, entropy, mask.double(), 0.05, high_kl_coef)
        theirs.backward()
        loss = Archer(kl_coef=0.05, high_entropy_kl_coef=high_kl_coef)
        _, ours, grad = _run(loss, log_probs, old, adv, ref, entropy, mask)
        assert ours == pytest.approx(theirs.item(), rel=1e-7, abs=1e-7)
        assert_close(grad, theirs_lp.grad, atol=1e-7, rtol=1e-6)


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="Archer: quantile must be in"):
        Archer(quantile=1.5)
    with pytest.raises(ValueError, match="Archer: clip_high_entropy must be >= 0"):
        Archer(clip_high_entropy=-0.1)


def test_aspo_by_hand():
    # A = +1, r = (1.3, 0.25, 0.8), eps (0.2, 0.2, 0.4): token 0 above 1.2 (value -1/1.2, no gradient); token 1's
    # weight 1/0.25 = 4 > 3: the soft dual clip, -3 log(0.2), gradient -3; token 2's weight 1/0.8: -1/0.8, gradient
    # -1.25; the mean over 3 tokens
    old = torch.log(torch.tensor([[0.5, 0.8, 0.5]]))
    log_probs = old + torch.log(torch.tensor([[1.3, 0.25, 0.8]]))
    out, total, grad = _run(ASPO(kl_coef=0.0), log_probs, old, torch.tensor([1.0]), old)
    assert total == pytest.approx((-1 / 1.2 - 3 * torch.log(torch.tensor(0.2)).item() - 1 / 0.8) / 3)
    assert_close(grad, torch.tensor([[0.0, -1.0, -1.25 / 3]]))
    # A = -1, r = (0.7, 4.0, 0.7): token 0 below 0.8 (no gradient), token 1 past c = 3 (gradient 3), token 2 within
    # its 0.4 (gradient 0.7)
    old = torch.log(torch.tensor([[0.5, 0.1, 0.5]]))
    log_probs = old + torch.log(torch.tensor([[0.7, 4.0, 0.7]]))
    out, total, grad = _run(ASPO(kl_coef=0.0), log_probs, old, torch.tensor([-1.0]), old)
    assert_close(grad, torch.tensor([[0.0, 1.0, 0.7 / 3]]))
    assert out.stats["dual_clip_frac"].item() == pytest.approx(1 / 3)


def authors_aspo_loss(log_prob, old_log_prob, advantages, entropy, response_mask):
    """wizard-III/Archer2.0 b08d963 restated, one response per micro-batch: dp_actor.py's entropy masks (the 0.8
    quantile), core_algos.compute_policy_loss_archer with the call's clips (0.2 / 0.4 on both sides) and c = 3."""
    total = 0.0
    for i in range(log_prob.shape[0]):
        log_prob_i, adv, mask = log_prob[i], advantages[i], response_mask[i]
        masked_entropy = torch.where(mask.bool(), entropy[i], torch.nan)
        q80 = torch.nanquantile(masked_entropy, q=0.8, dim=-1, keepdim=True)
        high_entropy_mask = (masked_entropy <= q80) & mask.bool()  # only low entropy token is True
        ratio = torch.exp(torch.clamp(log_prob_i - old_log_prob[i], min=-20.0, max=20.0))
        negative_clip_ratio = torch.where(
            high_entropy_mask, torch.clamp(ratio, min=1 - 0.2, max=None), torch.clamp(ratio, min=1 - 0.4, max=None)
        )
        positive_clip_ratio = torch.where(
            high_entropy_mask, torch.clamp(ratio, min=None, max=1 + 0.2), torch.clamp(ratio, min=None, max=1 + 0.4)
        )
        negative_pg_losses_clip = -adv * negative_clip_ratio
        positive_pg_losses_clip = (
            -adv * (positive_clip_ratio / positive_clip_ratio.detach()) / positive_clip_ratio.detach()
        )
        negative_dual_clip_ratio = torch.clamp(negative_clip_ratio, min=None, max=3.0)
        negative_clipped_mask = torch.gt(negative_clip_ratio, negative_dual_clip_ratio)
        negative_pg_losses_dual = -adv * negative_dual_clip_ratio.detach() * log_prob_i
        negative_pg_losses = torch.where(negative_clipped_mask, negative_pg_losses_dual, negative_pg_losses_clip)
        positive_dual_clip_ratio = torch.clamp(1 / positive_clip_ratio, min=None, max=3.0)
        positive_clipped_mask = torch.gt(1 / positive_clip_ratio, positive_dual_clip_ratio)
        positive_pg_losses_dual = -adv * positive_dual_clip_ratio.detach() * log_prob_i
        positive_pg_losses = torch.where(positive_clipped_mask, positive_pg_losses_dual, positive_pg_losses_clip)
        pg_losses = torch.where(adv < 0, negative_pg_losses, positive_pg_losses)
        total = total + _masked_mean(pg_losses, mask)
    return total / log_prob.shape[0]


def test_aspo_equals_the_authors_code():
    g = torch.Generator().manual_seed(2)
    for _ in range(200):
        rows, width = 4, int(torch.randint(1, 9, (1,), generator=g))
        lengths = torch.randint(1, width + 1, (rows,), generator=g)
        mask = torch.arange(width)[None] < lengths[:, None]
        old = -torch.rand(rows, width, generator=g, dtype=torch.float64) * 3
        log_probs = old + 1.2 * torch.randn(rows, width, generator=g, dtype=torch.float64)  # some past c = 3
        adv = torch.randn(rows, generator=g, dtype=torch.float64)
        entropy = torch.rand(rows, width, generator=g, dtype=torch.float64) * 4
        theirs_lp = log_probs.clone().requires_grad_()
        theirs = authors_aspo_loss(theirs_lp, old, adv, entropy, mask.double())
        theirs.backward()
        _, ours, grad = _run(ASPO(kl_coef=0.0), log_probs, old, adv, old, entropy, mask)
        assert ours == pytest.approx(theirs.item(), rel=1e-7, abs=1e-7)
        assert_close(grad, theirs_lp.grad, atol=1e-7, rtol=1e-6)


def test_aspo_needs_a_dual_clip():
    with pytest.raises(ValueError, match="ASPO: dual_clip must be a number > 1"):
        ASPO(dual_clip=None)

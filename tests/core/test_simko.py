"""SimKO (arXiv:2510.14807): the gradient's split over the top-K candidates and the pressed top-1 by hand, the
high-entropy tokens, and equal to the authors' `compute_policy_loss_simko` restated on random batches."""

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core import SimKO, aggregate_loss
from rlvr_lightning.core.losses.policy_losses import policy_loss
from rlvr_lightning.core.losses.top_k_boost import high_entropy_tokens


def test_high_entropy_tokens_by_hand():
    entropy = torch.tensor([[0.1, 0.9, 0.5, 7.0], [0.3, 0.2, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    # row 0: the 0.8-quantile of (0.1, 0.5, 0.9) is 0.5 + 0.6 * 0.4 = 0.74: only 0.9 is above (7.0 is padding);
    # row 1: of (0.2, 0.3) it is 0.28: only 0.3
    assert high_entropy_tokens(entropy, mask, 0.8).tolist() == [
        [False, True, False, False],
        [True, False, False, False],
    ]


def _inputs(correct: bool, advantage: float, top1_sampled: bool):
    log_probs = torch.tensor([[-1.0, -0.5]], requires_grad=True)
    top = torch.tensor([[[-0.5, -1.5], [-0.5, -1.0]]], requires_grad=True)
    sampled = torch.tensor([[[False, False], [top1_sampled, False]]])
    inputs = dict(entropy=torch.tensor([[0.1, 0.9]]), correct=torch.tensor([correct]), top_log_probs=top)
    return log_probs, top, torch.tensor([advantage]), dict(inputs, top_is_sampled=sampled)


def test_a_correct_responses_forking_token_spreads_its_push_over_the_top_k_by_hand():
    log_probs, top, adv, inputs = _inputs(True, 1.0, True)
    out = SimKO(top_k=2, mix_coef=0.1)(log_probs, None, adv, None, **inputs)
    # on-policy, r = 1: each token's loss -A r = -1 in value
    assert out.loss.tolist() == [pytest.approx([-1.0, -1.0])]
    out.loss.sum().backward()
    # the second token is the forking one (entropy 0.9 > the 0.8-quantile 0.74): 0.9 of its gradient on the sampled
    # token, 0.1 / 2 on each of the two candidates; the first token as PPO's
    assert log_probs.grad.tolist() == [pytest.approx([-1.0, -0.9])]
    assert top.grad.tolist() == [[pytest.approx([0.0, 0.0]), pytest.approx([-0.05, -0.05])]]
    assert out.stats["simko_boosted"].item() == pytest.approx(0.5)
    assert out.stats["simko_pressed"].item() == 0.0


def test_an_incorrect_responses_top_1_forking_token_is_pressed_harder_by_hand():
    log_probs, top, adv, inputs = _inputs(False, -1.0, True)
    out = SimKO(top_k=2, mix_coef=0.1, negative_scale=1.1)(log_probs, None, adv, None, **inputs)
    out.loss.sum().backward()
    assert log_probs.grad.tolist() == [pytest.approx([1.0, 1.1])]
    assert top.grad is None or top.grad.abs().sum().item() == 0.0  # no candidate boosted
    assert out.stats["simko_pressed"].item() == pytest.approx(0.5)
    # the sampled token not its position's top-1: PPO's gradient
    log_probs, _, adv, inputs = _inputs(False, -1.0, False)
    SimKO(top_k=2)(log_probs, None, adv, None, **inputs).loss.sum().backward()
    assert log_probs.grad.tolist() == [pytest.approx([1.0, 1.0])]


def _row_quantile_masked(x, mask, q):
    """The authors' ``row_quantile_masked`` (CLR-Lab/SimKO core_algos.py at 306f4ff), restated."""
    qs = []
    for b in range(x.shape[0]):
        xb = x[b][mask[b]]
        if xb.numel() == 0:
            xb = x[b]
        qs.append(torch.quantile(xb, q))
    return torch.stack(qs, dim=0)


def _authors_simko(old_log_prob, log_prob, topk_log_probs, entropy, advantages, eos_mask, cliprange, scores, max_token,
                   mix_topk_coef, tau):  # fmt: skip
    """The authors' ``compute_policy_loss_simko`` (CLR-Lab/SimKO verl/trainer/ppo/core_algos.py at 306f4ff) restated:
    the old top-K log-probs cancel in it (they enter as ``x - sg(x)``), so they are the current ones detached."""
    correct_idx = scores.sum(-1) == 1
    k = topk_log_probs.size(-1)
    numerator = torch.exp((log_prob - old_log_prob).detach())
    diff_topk = topk_log_probs - topk_log_probs.detach()
    topk_sum = ((numerator.unsqueeze(-1) / (torch.exp(diff_topk.detach()) + 1e-8)) * torch.exp(diff_topk)).sum(-1)
    b, t = log_prob.shape
    has_label = correct_idx.view(b, 1).expand(b, t)
    threshold = _row_quantile_masked(entropy, eos_mask, tau).view(-1, 1)
    w = (entropy > threshold).float()
    mix_topk_pos = mix_topk_coef * w * eos_mask
    correct_mask = has_label & eos_mask
    ratio = torch.exp(log_prob - old_log_prob)
    ratio = torch.where(correct_mask, (1.0 - mix_topk_pos) * ratio + (mix_topk_pos / float(k)) * topk_sum, ratio)
    neg_mask = (advantages.sum(dim=-1) < 0).unsqueeze(-1)
    neg_mask = (max_token > 0) & neg_mask & (entropy > threshold)
    advantages = advantages * torch.ones_like(advantages).masked_fill(neg_mask, 1.1)
    pg_losses = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    losses = torch.max(pg_losses, pg_losses2)
    return (losses * eos_mask).sum() / eos_mask.sum()


def test_equals_the_authors_loss_and_gradient_on_random_batches():
    generator = torch.Generator().manual_seed(0)
    loss_fn = SimKO(top_k=3, mix_coef=0.2, entropy_quantile=0.8, negative_scale=1.1)
    for _ in range(100):
        n, t = torch.randint(1, 6, (2,), generator=generator).tolist()
        old = torch.log(torch.rand(n, t, generator=generator).clamp_min(1e-3))
        log_probs = (old + 0.2 * torch.randn(n, t, generator=generator)).clamp_max(0.0)
        top = torch.log(torch.rand(n, t, 3, generator=generator).clamp_min(1e-3))
        entropy = torch.rand(n, t, generator=generator)
        mask = torch.rand(n, t, generator=generator) < 0.8
        mask[:, 0] = True
        correct = torch.rand(n, generator=generator) < 0.5
        advantages = torch.randn(n, generator=generator)
        sampled = torch.rand(n, t, 3, generator=generator) < 0.3
        ours_lp, theirs_lp = log_probs.clone().requires_grad_(), log_probs.clone().requires_grad_()
        ours_top, theirs_top = top.clone().requires_grad_(), top.clone().requires_grad_()
        inputs = dict(entropy=entropy, correct=correct, top_log_probs=ours_top, top_is_sampled=sampled)
        out = loss_fn(ours_lp, old, advantages, mask, **inputs)
        ours = aggregate_loss(out.loss, mask, "token-mean")
        scores = torch.zeros(n, t)
        scores[:, 0] = correct.float()
        per_token = advantages.unsqueeze(-1).expand(n, t) * mask
        theirs = _authors_simko(
            old, theirs_lp, theirs_top, entropy, per_token, mask, 0.2, scores, sampled[..., 0], 0.2, 0.8
        )
        assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
        ours.backward()
        theirs.backward()
        assert_close(ours_lp.grad, theirs_lp.grad, rtol=1e-5, atol=1e-6)
        assert_close(ours_top.grad, theirs_top.grad, rtol=1e-5, atol=1e-6)


def test_options_and_inputs_are_checked():
    with pytest.raises(ValueError, match="top_k must be >= 1, got 0"):
        SimKO(top_k=0)
    with pytest.raises(ValueError, match=r"mix_coef and entropy_quantile must be in \[0, 1\], got 1.5"):
        SimKO(mix_coef=1.5)
    with pytest.raises(ValueError, match="negative_scale must be >= 0"):
        SimKO(negative_scale=-1)
    with pytest.raises(ValueError, match="SimKO needs the entropies, correctness and top-K log-probs"):
        SimKO()(torch.zeros(1, 2), None, torch.zeros(1), None)
    loss = policy_loss("simko")
    assert type(loss) is SimKO and loss.reads_top_k == 3 and loss.reads_correctness and loss.reads_entropy

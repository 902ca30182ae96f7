"""LUFFY's loss (Yan et al. 2025, arXiv:2504.14945): by hand, and against the authors' code restated."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr_lightning.core import LUFFY, PPOClip, merged_stats, policy_loss
from rlvr_lightning.core.aggregation import aggregate_loss
from rlvr_lightning.core.losses.off_policy_guidance import policy_shaping


def _luffy_restated(old_log_prob, log_prob, advantages, eos_mask, prefix_mask, cliprange, reshape, remove_clip):
    """The per-token and token-mean losses of LUFFY's `compute_token_on_off_policy_loss`
    (ElliottYan/LUFFY luffy/verl/verl/mix_src/mix_core_alg.py, read at f12773a of a mirror), restated for
    on_policy_reshape "no_reshape", off_policy_reshape "p_div_p_0.1" or "no_reshape", no off-policy clips."""
    ratio = torch.exp(log_prob - old_log_prob)
    on = -advantages * ratio
    if not remove_clip:
        on = torch.max(on, -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange))
    off_ratio = torch.exp(log_prob)
    if reshape == "p_div_p_0.1":
        off_ratio = off_ratio / (off_ratio + 0.1)
    off = -advantages * off_ratio
    prefix = prefix_mask.float()
    per_token = off * prefix + on * (1 - prefix)
    return per_token, (per_token * eos_mask).sum() / eos_mask.sum()


def test_policy_shaping_by_hand():
    p = torch.tensor([0.0, 0.1, 0.3, 1.0])
    assert policy_shaping(p, 0.1).tolist() == pytest.approx([0.0, 0.5, 0.75, 1.0 / 1.1])
    assert policy_shaping(p, None).tolist() == pytest.approx(p.tolist())


def test_loss_and_gradient_by_hand():
    """Row 0 sampled, row 1 a demonstration, p = 0.2 and 0.4 on each; A = 2 and -3; old = current (ratio 1)."""
    log_probs = torch.log(torch.tensor([[0.2, 0.4], [0.2, 0.4]])).requires_grad_()
    advantages = torch.tensor([2.0, -3.0])
    out = LUFFY(gamma=0.1)(log_probs, None, advantages, None, demonstration_rows=torch.tensor([False, True]))
    # sampled: PPO at ratio 1, -A; demonstration: -A p / (p + 0.1) = 3 * (2/3, 0.8)
    assert out.loss.detach().tolist() == [pytest.approx([-2.0, -2.0]), pytest.approx([2.0, 2.4])]
    out.loss.sum().backward()
    # d/dlog p of -A p / (p + g) = -A g p / (p + g)^2: 3 * 0.1 * 0.2 / 0.09, 3 * 0.1 * 0.4 / 0.25
    assert log_probs.grad.tolist() == [pytest.approx([-2.0, -2.0]), pytest.approx([0.06 / 0.09, 0.12 / 0.25])]
    assert out.stats["demonstration_prob"].item() == pytest.approx(0.3)


def test_unshaped_ablation_and_masked_tokens():
    log_probs = torch.log(torch.tensor([[0.5, 0.25, 0.9]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    out = LUFFY(gamma=None)(log_probs, None, torch.tensor([1.0]), mask, demonstration_rows=torch.tensor([True]))
    assert out.loss.tolist() == [pytest.approx([-0.5, -0.25, 0.0])]  # -A p; nothing on padding
    assert out.stats["demonstration_prob"].item() == pytest.approx(0.375)


def test_without_demonstrations_it_is_the_on_policy_loss_to_the_bit():
    gen = torch.Generator().manual_seed(0)
    log_probs = -torch.rand(6, 5, generator=gen) * 3
    old = log_probs + 0.3 * torch.randn(6, 5, generator=gen)
    advantages = torch.randn(6, generator=gen)
    mask = (torch.rand(6, 5, generator=gen) > 0.2).float()
    inner = PPOClip(0.2, 0.28)
    expected = inner(log_probs, old, advantages, mask)
    for rows in (None, torch.zeros(6, dtype=torch.bool)):
        out = LUFFY(on_policy=inner)(log_probs, old, advantages, mask, demonstration_rows=rows)
        assert torch.equal(out.loss, expected.loss)
        stats, inner_stats = out.stats, expected.stats
        assert all(torch.equal(stats[key], inner_stats[key]) for key in inner_stats)


@pytest.mark.parametrize("reshape", ["p_div_p_0.1", "no_reshape"])
@pytest.mark.parametrize("remove_clip", [False, True])
def test_equal_to_the_authors_code_restated(reshape, remove_clip):
    gen = torch.Generator().manual_seed(1)
    for _ in range(50):
        n, t = 8, 7
        log_probs = -torch.rand(n, t, generator=gen) * 4
        old = log_probs + 0.4 * torch.randn(n, t, generator=gen)
        advantages = torch.randn(n, generator=gen)
        mask = (torch.rand(n, t, generator=gen) > 0.25).float()
        rows = torch.rand(n, generator=gen) < 0.3
        loss = LUFFY(gamma=0.1 if reshape == "p_div_p_0.1" else None, on_policy="ratio" if remove_clip else "ppo_clip")
        out = loss(log_probs, old, advantages, mask, demonstration_rows=rows)
        per_token, mean = _luffy_restated(
            old, log_probs, advantages.unsqueeze(-1).expand(n, t), mask, rows.unsqueeze(-1).expand(n, t), 0.2,
            reshape, remove_clip,
        )  # fmt: skip
        torch.testing.assert_close(out.loss, per_token * mask, rtol=0, atol=1e-6)
        torch.testing.assert_close(aggregate_loss(out.loss, mask, "token-mean"), mean, rtol=0, atol=1e-6)


def test_no_clip_is_counted_on_a_demonstration():
    log_probs = torch.log(torch.tensor([[0.9], [0.9]]))
    old = torch.log(torch.tensor([[0.3], [0.3]]))  # ratio 3: clipped above for A > 0
    out = LUFFY()(log_probs, old, torch.tensor([1.0, 1.0]), None, demonstration_rows=torch.tensor([False, True]))
    assert out.high_clipped.tolist() == [[True], [False]]
    assert out.stats["clip_frac_high"].item() == pytest.approx(0.5)


def test_demonstration_prob_weighs_tokens_across_micro_batches():
    """Merged over micro-batches, the mean probability counts each demonstration token once (a micro-batch without
    demonstrations adds nothing)."""
    loss = LUFFY()
    first = loss(
        torch.log(torch.tensor([[0.2, 0.4]])), None, torch.ones(1), None, demonstration_rows=torch.tensor([True])
    )
    second = loss(
        torch.log(torch.tensor([[0.9, 0.9]])), None, torch.ones(1), None, demonstration_rows=torch.tensor([False])
    )
    third = loss(torch.log(torch.tensor([[0.6, 0.0]])), None, torch.ones(1), torch.tensor([[1.0, 0.0]]),
                 demonstration_rows=torch.tensor([True]))  # fmt: skip
    assert merged_stats([first, second, third])["demonstration_prob"].item() == pytest.approx(1.2 / 3)


def test_options_are_checked():
    assert isinstance(policy_loss("luffy"), LUFFY)
    with pytest.raises(ValueError, match="gamma must be > 0"):
        LUFFY(gamma=0.0)
    with pytest.raises(ValueError, match="on_policy=HighEntropyTokens reads more"):
        LUFFY(on_policy="high_entropy")
    with pytest.raises(ValueError, match="EntropyShapedAdvantage: LUFFY reads demonstrations"):
        policy_loss("entropy_shaped").__class__(loss="luffy")
    assert math.isclose(LUFFY(on_policy="cispo").gamma, 0.1)

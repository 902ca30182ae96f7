"""M2PO (Zheng et al. 2025, arXiv:2510.01161): the second-moment mask by hand, against Trinity-RFT's restatement of
the paper's Algorithm 1, and the loss."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr_lightning.core import M2PO, merged_stats, policy_loss
from rlvr_lightning.core.losses.second_moment import second_moment_keep
from rlvr_lightning.core.losses.token_selection import pick_tokens


def _trinity_mask(log_ratio, action_mask, advantages, m2_threshold):
    """Trinity-RFT's `_compute_m2po_mask` (trinity/algorithm/policy_loss_fn/m2po_policy_loss.py, "Algorithm 1 of
    the M2PO paper"), restated: the trust-region tokens' squared log-ratios sorted ascending, the longest prefix
    whose mean is <= the threshold kept, the rest of the trust region masked; every other valid token kept."""
    valid = action_mask.bool()
    second = log_ratio.float().square()
    trust = valid & (((advantages > 0) & (log_ratio > 0)) | ((advantages < 0) & (log_ratio < 0)))
    final = valid.clone().reshape(-1)
    indices = torch.nonzero(trust.reshape(-1)).squeeze(-1)
    values = second.reshape(-1)[indices]
    if values.numel() and values.mean().item() > m2_threshold:
        sorted_values, order = torch.sort(values)
        means = torch.cumsum(sorted_values, 0) / torch.arange(1, values.numel() + 1, dtype=sorted_values.dtype)
        keep = int((means <= m2_threshold).sum().item())
        final[indices[order[keep:]]] = False
    return final.view_as(valid)


def test_the_mask_by_hand():
    # log r: 0.1, 0.3, 0.5 with A > 0 (trust region: squares 0.01, 0.09, 0.25), -0.4 with A > 0 (outside: the
    # clip would not act), -0.2 with A < 0 (trust region: 0.04), 0.6 with A = 0 (outside)
    log_ratio = torch.tensor([0.1, 0.3, 0.5, -0.4, -0.2, 0.6])
    advantages = torch.tensor([1.0, 1.0, 1.0, 1.0, -1.0, 0.0])
    # sorted trust region 0.01, 0.04, 0.09, 0.25: prefix means 0.01, 0.025, 0.0467, 0.0975
    assert second_moment_keep(log_ratio, advantages, 0.04).tolist() == [True, False, False, True, True, True]
    assert second_moment_keep(log_ratio, advantages, 0.05).tolist() == [True, True, False, True, True, True]
    assert second_moment_keep(log_ratio, advantages, 0.1).all()  # the region's mean 0.0975 fits: nothing dropped
    assert second_moment_keep(log_ratio, advantages, 0.0).tolist() == [False, False, False, True, False, True]


def test_the_mask_equals_the_restated_algorithm_on_random_batches():
    gen = torch.Generator().manual_seed(0)
    for trial in range(200):
        n, t = 6, 9
        log_ratio = 0.4 * torch.randn(n, t, generator=gen) * (1 + trial % 3)
        advantages = torch.randn(n, 1, generator=gen).expand(n, t).clone()
        advantages[0] = 0.0
        mask = torch.rand(n, t, generator=gen) > 0.2
        tau = [0.0, 0.01, 0.04, 0.2][trial % 4]
        expected = _trinity_mask(log_ratio, mask, advantages, tau)
        old = -torch.rand(n, t, generator=gen)
        picked = pick_tokens(M2PO(tau), old + log_ratio, old, advantages, mask.float())
        assert torch.equal(picked, expected), trial


def test_the_loss_is_the_unclipped_ratio_on_the_kept_tokens():
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    log_probs = (old + torch.tensor([[0.1, 0.5, -0.3]])).requires_grad_()
    advantages = torch.tensor([2.0])
    loss = M2PO(0.04)
    selected = pick_tokens(loss, log_probs, old, advantages, None)
    assert selected.tolist() == [[True, False, True]]  # 0.25 > 0.04 leaves; -0.3 with A > 0 is outside the region
    out = loss(log_probs, old, advantages, None, selected=selected)
    ratio = [math.exp(0.1), math.exp(-0.3)]
    assert out.loss.detach().tolist() == [pytest.approx([-2 * ratio[0], 0.0, -2 * ratio[1]])]
    out.loss.sum().backward()
    assert log_probs.grad.tolist() == [pytest.approx([-2 * ratio[0], 0.0, -2 * ratio[1]])]  # d r / d log p = r
    assert out.stats["m2_masked_frac"].item() == pytest.approx(1 / 3)
    assert out.stats["clip_frac_low"].item() == 0.0 and out.stats["clip_frac_high"].item() == 0.0


def test_the_masked_fraction_weighs_tokens_across_micro_batches():
    loss = M2PO(0.04)
    old = torch.zeros(1, 4)
    first = loss(old + 1.0, old, torch.ones(1), None, selected=torch.tensor([[False, False, False, True]]))
    second = loss(old[:, :2] + 1.0, old[:, :2], torch.ones(1), None, selected=torch.tensor([[True, True]]))
    assert merged_stats([first, second])["m2_masked_frac"].item() == pytest.approx(3 / 6)


def test_options_and_inputs_are_checked():
    assert isinstance(policy_loss("m2po"), M2PO) and policy_loss("m2po").m2_threshold == 0.04
    with pytest.raises(ValueError, match="m2_threshold must be >= 0"):
        M2PO(-0.1)
    log_probs, old = torch.tensor([[-1.0, -1.0]]), torch.tensor([[-1.1, -1.5]])  # log r 0.1, 0.5 with A > 0
    alone = M2PO()(log_probs, old, torch.ones(1), None)  # no pick handed over: picked among these tokens
    assert alone.loss.tolist() == [pytest.approx([-math.exp(0.1), 0.0])]

"""HighEntropyTokens, ClipCov and KLCov: hand-computed picks, values and gradients."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.losses.policy_losses import ClipCov, HighEntropyTokens, KLCov, PPOClip, policy_loss
from rlvr_lightning.core.losses.token_selection import pick_tokens

LOG_PROBS = [[-1.0, -2.0, -3.0], [-0.5, -1.5, -9.0]]
MASK = torch.tensor([[True, True, True], [True, True, False]])


def test_high_entropy_tokens_keep_the_top_quantile_by_entropy():
    log_probs = torch.tensor(LOG_PROBS, requires_grad=True)
    entropy = torch.tensor([[0.1, 0.5, 0.9], [0.3, 0.7, 5.0]])  # 5.0 is padding: never counted
    loss = HighEntropyTokens(PPOClip(), top_quantile=0.4)
    # real entropies 0.1 0.3 0.5 0.7 0.9: the 0.6 quantile is 0.5 + 0.4 * (0.7 - 0.5) = 0.58 -> keep 0.7 and 0.9
    selected = pick_tokens(loss, log_probs, None, torch.tensor([1.0, -1.0]), MASK, entropy)
    assert selected.tolist() == [[False, False, True], [False, True, False]]
    out = loss(log_probs, None, torch.tensor([1.0, -1.0]), MASK, selected=selected)
    # ratio 1: l = -A on the kept tokens, 0 elsewhere; the gradient of -A r is -A
    assert_close(out.loss, torch.tensor([[0.0, 0.0, -1.0], [0.0, 1.0, 0.0]]))
    out.loss.sum().backward()
    assert_close(log_probs.grad, torch.tensor([[0.0, 0.0, -1.0], [0.0, 1.0, 0.0]]))
    assert_close(out.stats["selected_frac"], torch.tensor(0.4))
    with pytest.raises(ValueError, match="pass selected="):
        loss(log_probs, None, torch.tensor([1.0, -1.0]), MASK)


def test_high_entropy_tokens_take_the_wrapped_loss_by_shorthand_and_check_it():
    loss = policy_loss("high_entropy")
    assert type(loss.loss) is PPOClip and loss.top_quantile == 0.2 and loss.needs_old_log_probs
    assert not HighEntropyTokens("pg").needs_old_log_probs
    with pytest.raises(ValueError, match="top_quantile must be in"):
        HighEntropyTokens(top_quantile=1.5)
    with pytest.raises(ValueError, match="GSPO is a sequence-level objective"):
        HighEntropyTokens("gspo").check("seq-sum-constant")


def test_kl_cov_penalises_the_top_covariance_token():
    log_probs = torch.tensor([[-1.0, -2.0], [-3.0, -3.5]], requires_grad=True)
    old = torch.tensor([[-1.5, -2.0], [-3.0, -3.5]])
    advantages = torch.tensor([2.0, -2.0])
    # mean A = 0, mean log p = -2.375: cov = 2 * 1.375, 2 * 0.375, -2 * -0.625, -2 * -1.125 = 2.75, 0.75, 1.25, 2.25
    # -> the top 1 of 4 is the first
    loss = KLCov(kl_cov_ratio=0.25, ppo_kl_coef=0.5)
    out = loss(log_probs, old, advantages, None)
    ratio = math.exp(0.5)
    # l = -A r (+ 0.5 |log p - old| = 0.25 on the picked token)
    assert_close(out.loss, torch.tensor([[-2 * ratio + 0.25, -2.0], [2.0, 2.0]]))
    out.loss.sum().backward()
    assert_close(log_probs.grad, torch.tensor([[-2 * ratio + 0.5, -2.0], [2.0, 2.0]]))


def test_clip_cov_takes_the_gradient_off_a_token_in_the_band_where_the_clip_does_not_bind():
    log_probs = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -2.0], [-3.0, -4.0 - 0.5]])  # the last token's ratio e^0.5 is clipped (A < 0: no)
    advantages = torch.tensor([2.0, -2.0])
    # cov = 3, 1, 1, 3; band (2, 4) holds the first and last; the last: A = -2 < 0 with r > 1 + eps is not clipped
    # (the clip binds for A < 0 only below 1 - eps), so both are candidates; 0.25 * 4 = 1 is picked at random
    loss = ClipCov(clip_low=0.2, clip_cov_ratio=0.25, clip_cov_lb=2.0, clip_cov_ub=4.0)
    torch.manual_seed(0)
    out = loss(log_probs, old, advantages, None)
    picked = out.loss.detach() == 0
    assert picked.sum() == 1 and (picked[0, 0] or picked[1, 1])
    expected = torch.tensor([[-2.0, -2.0], [2.0, 2.0 * math.exp(0.5)]]).masked_fill(picked, 0.0)
    assert_close(out.loss, expected)
    out.loss.sum().backward()
    assert_close(log_probs.grad, expected)  # d(-A r)/d log p = -A r
    # a clipped token is never picked: A > 0 with r > 1 + eps
    old_clipped = torch.tensor([[-1.5, -2.0], [-3.0, -4.0]])
    for seed in range(5):
        torch.manual_seed(seed)
        assert pick_tokens(loss, log_probs, old_clipped, advantages, None).tolist() == [[False, False], [False, True]]


def test_covariance_losses_check_their_options():
    with pytest.raises(ValueError, match="clip_cov_ratio must be in"):
        ClipCov(clip_cov_ratio=0.0)
    with pytest.raises(ValueError, match="need clip_cov_lb < clip_cov_ub"):
        ClipCov(clip_cov_lb=5.0, clip_cov_ub=1.0)
    with pytest.raises(ValueError, match="kl_cov_ratio must be in"):
        KLCov(kl_cov_ratio=2.0)
    assert type(policy_loss("clip_cov")) is ClipCov and type(policy_loss("kl_cov")) is KLCov

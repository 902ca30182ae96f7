"""GVPO (arXiv:2504.19599): the loss and its gradient by hand, centred REINFORCE on the first update, and equal to
the authors' `compute_policy_loss_gvpo` (verl recipe), restated."""

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.aggregation import aggregate_loss
from rlvr_lightning.core.losses.group_variance import group_variance_losses
from rlvr_lightning.core.losses.policy_losses import GVPO, policy_loss


def test_the_loss_by_hand():
    # one group of 2: s = (1, -1), beta 0.1: beta (s - mean s) = (0.1, -0.1); advantages (0.5, -0.5)
    # e = (0.1 - 0.5, -0.1 + 0.5) = (-0.4, 0.4): 1/2 e^2 / (2 - 1) = 0.08 each
    log_ratios = torch.tensor([1.0, -1.0], requires_grad=True)
    losses, term = group_variance_losses(log_ratios, torch.tensor([0.5, -0.5]), torch.tensor([7, 7]), 2, 0.1)
    assert losses.tolist() == pytest.approx([0.08, 0.08])
    assert term.tolist() == pytest.approx([0.1, -0.1])
    losses.sum().backward()
    # d/ds_i = e_i beta / (k - 1), the group's mean taken without gradient
    assert log_ratios.grad.tolist() == pytest.approx([-0.04, 0.04])


def test_the_loss_spread_over_tokens_sums_back_and_every_token_gets_its_rows_gradient():
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.4, 0.2, 0.1]]))
    log_probs = (old + torch.tensor([[0.5, 0.5, 0.3], [-0.5, -0.5, 0.0]])).requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # the first response has two tokens: s = (1, -1)
    group = dict(group_index=torch.tensor([3, 3]), group_size=2)
    out = GVPO(beta=0.1)(log_probs, old, torch.tensor([0.5, -0.5]), mask, **group)
    assert aggregate_loss(out.loss, mask, "seq-mean-token-sum").item() == pytest.approx(0.08)  # the mean of 0.08, 0.08
    assert out.loss[0].tolist() == pytest.approx([0.04, 0.04, 0.0])  # 0.08 over two tokens, none on padding
    out.loss.sum().backward()
    assert log_probs.grad.tolist() == [pytest.approx([-0.04, -0.04, 0.0]), pytest.approx([0.04, 0.04, 0.04])]
    assert out.stats["gvpo_log_ratio_term"].item() == pytest.approx(0.1)


def test_the_first_update_is_centred_reinforce():
    log_probs = torch.randn(4, 3).requires_grad_()
    advantages = torch.tensor([1.0, -1.0, 0.25, -0.25])
    out = GVPO(beta=0.5)(log_probs, None, advantages, None, group_index=torch.tensor([0, 0, 1, 1]), group_size=2)
    out.loss.sum().backward()
    # s = 0: loss 1/2 A^2 / (k - 1), gradient -A beta / (k - 1) on every token of the response
    assert out.loss.sum(-1).tolist() == pytest.approx((0.5 * advantages.square()).tolist())
    assert_close(log_probs.grad, (-0.5 * advantages).unsqueeze(-1).expand(4, 3))


def _authors_gvpo(old_log_prob, log_prob, advantages, response_mask, beta, uid, n):
    """The authors' ``compute_policy_loss_gvpo`` (github.com/jszkc/GVPO; recipe/gvpo/gvpo_core_algos.py of
    github.com/zichongli5/verl f5953e9), restated for one process (its all-gather over one rank is the identity)."""
    rtheta = ((log_prob * response_mask).sum(dim=-1) - (old_log_prob * response_mask).sum(dim=-1)) * beta
    r_minus_avg = (advantages * response_mask).sum(dim=-1) / response_mask.sum(dim=-1)
    data = {"rtheta": rtheta.clone().detach(), "uid": uid}
    means = {}
    for u in torch.unique(data["uid"]):
        mask = data["uid"] == u
        means[u.item()] = data["rtheta"][mask].mean()
    pg_loss = 0
    for i in range(len(rtheta)):
        pg_loss += 0.5 * ((rtheta[i] - means[uid[i].item()]) - r_minus_avg[i]) ** 2
    return pg_loss / (n - 1)


@pytest.mark.parametrize("group_size", [2, 4])
def test_equals_the_authors_loss_and_gradient_on_random_batches(group_size):
    generator = torch.Generator().manual_seed(0)
    loss_fn = GVPO(beta=0.1)
    for _ in range(100):
        groups, t = torch.randint(1, 5, (2,), generator=generator).tolist()
        n = groups * group_size
        old = torch.log(torch.rand(n, t, generator=generator).clamp_min(1e-3))
        log_probs = (old + 0.3 * torch.randn(n, t, generator=generator)).clamp_max(0.0)
        rewards = torch.rand(groups, group_size, generator=generator)
        advantages = (rewards - rewards.mean(-1, keepdim=True)).flatten().unsqueeze(-1).expand(n, t)
        mask = (torch.rand(n, t, generator=generator) < 0.8).float()
        mask[:, 0] = 1.0
        uid = torch.randperm(groups, generator=generator).repeat_interleave(group_size) + 100
        ours_lp, theirs_lp = log_probs.clone().requires_grad_(), log_probs.clone().requires_grad_()
        out = loss_fn(ours_lp, old, advantages, mask, group_index=uid, group_size=group_size)
        ours = aggregate_loss(out.loss, mask, "seq-mean-token-sum") * n  # the authors sum over the responses
        theirs = _authors_gvpo(old, theirs_lp, advantages, mask, 0.1, uid, group_size)
        assert_close(ours, theirs, rtol=1e-5, atol=1e-7)
        ours.backward()
        theirs.backward()
        assert_close(ours_lp.grad, theirs_lp.grad, rtol=1e-5, atol=1e-7)


def test_a_group_cut_across_micro_batches_is_refused():
    with pytest.raises(ValueError, match=r"over its 2 rows, consecutive in one micro-batch: .*holds 3 rows"):
        GVPO()(torch.zeros(3, 2), None, torch.zeros(3), None, group_index=torch.tensor([0, 0, 1]), group_size=2)
    with pytest.raises(RuntimeError, match="over its 2 rows, consecutive in one micro-batch: set update.shuffle"):
        GVPO()(torch.zeros(4, 2), None, torch.zeros(4), None, group_index=torch.tensor([0, 1, 0, 1]), group_size=2)
    with pytest.raises(ValueError, match="GVPO needs each row's group"):
        GVPO()(torch.zeros(2, 2), None, torch.zeros(2), None)


def test_options_and_modes_are_checked():
    with pytest.raises(ValueError, match="beta must be > 0, got 0"):
        GVPO(beta=0)
    with pytest.raises(ValueError, match="needs aggregation seq-mean-token-sum .*not 'token-mean'"):
        GVPO().check("token-mean")
    GVPO().check("seq-mean-token-sum")
    with pytest.raises(ValueError, match="GVPO uses no importance ratio"):
        GVPO().with_rollout_is(torch.zeros(2, 2), None, torch.zeros(2), None, torch.ones(2, 2))
    assert type(policy_loss("gvpo")) is GVPO


def test_without_centring_the_log_ratio_it_is_kimi_k15s_mirror_descent_by_hand():
    # s = (1, 0), beta 0.1, advantages (0.5, -0.5): 1/2 (0.1 - 0.5)^2 = 0.08, 1/2 (0 + 0.5)^2 = 0.125; no group read
    log_ratios = torch.tensor([1.0, 0.0], requires_grad=True)
    losses, term = group_variance_losses(log_ratios, torch.tensor([0.5, -0.5]), None, 0, 0.1)
    assert losses.tolist() == pytest.approx([0.08, 0.125])
    assert term.tolist() == pytest.approx([0.1, 0.0])
    losses.sum().backward()
    assert log_ratios.grad.tolist() == pytest.approx([0.1 * (0.1 - 0.5), 0.1 * 0.5])  # beta (beta s - A)
    assert not GVPO(center_log_ratio=False).reads_groups and GVPO().reads_groups


def _kimi_surrogate(log_prob, old_log_prob, rewards, response_mask, tau):
    """Kimi k1.5 (arXiv:2501.12599), the online mirror descent's gradient for one prompt's k responses, as a
    surrogate: 1/k sum_j [-(r_j - mean r) log pi(y_j) + tau/2 (log pi(y_j)/pi_old(y_j))^2], restated."""
    log_ratio = ((log_prob - old_log_prob) * response_mask).sum(-1)
    log_pi = (log_prob * response_mask).sum(-1)
    return (-(rewards - rewards.mean()) * log_pi + tau / 2 * log_ratio.square()).mean()


def test_without_centring_its_gradient_is_kimi_k15s_times_beta_on_random_groups():
    generator = torch.Generator().manual_seed(1)
    loss_fn = GVPO(beta=0.2, center_log_ratio=False)
    for _ in range(50):
        k, t = torch.randint(2, 8, (2,), generator=generator).tolist()
        old = torch.log(torch.rand(k, t, generator=generator).clamp_min(1e-3))
        log_probs = (old + 0.3 * torch.randn(k, t, generator=generator)).clamp_max(0.0)
        rewards = torch.rand(k, generator=generator)
        mask = (torch.rand(k, t, generator=generator) < 0.8).float()
        mask[:, 0] = 1.0
        ours_lp, theirs_lp = log_probs.clone().requires_grad_(), log_probs.clone().requires_grad_()
        out = loss_fn(ours_lp, old, rewards - rewards.mean(), mask)
        aggregate_loss(out.loss, mask, "seq-mean-token-sum").backward()
        _kimi_surrogate(theirs_lp, old, rewards, mask, tau=0.2).backward()
        assert_close(ours_lp.grad, 0.2 * theirs_lp.grad, rtol=1e-5, atol=1e-7)

"""TOPR (Tapered Off-Policy REINFORCE) against hand-computed examples and the paper's per-response update."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.aggregation import aggregate_loss
from rlvr_lightning.core.losses.policy_losses import TOPR, PolicyGradient, policy_loss


def test_topr_weighs_only_the_negative_responses_by_their_truncated_trajectory_ratio():
    # row 0: A = +1, trajectory log-ratio 0.2 -> w = 1 (positives are never weighed)
    # row 1: A = -1, log-ratio 0 + 0.6 = 0.6 -> ratio e^0.6 = 1.822, truncated to w = 1
    # row 2: A = -2, log-ratio 0 - 0.1 = -0.1 -> w = e^-0.1 = 0.9048
    # d l_t / d logp_t = -w A: -1, +1, +2 e^-0.1
    log_probs = torch.tensor([[-1.0, -2.0], [-0.5, -0.3], [-0.1, -0.2]], requires_grad=True)
    old = torch.tensor([[-1.2, -2.0], [-0.5, -0.9], [-0.1, -0.1]])
    adv = torch.tensor([1.0, -1.0, -2.0])
    out = TOPR()(log_probs, old, adv, None)
    w2 = math.exp(-0.1)
    assert_close(out.loss, torch.tensor([[1.0, 2.0], [-0.5, -0.3], [-0.2 * w2, -0.4 * w2]]))
    out.loss.sum().backward()
    assert_close(log_probs.grad, torch.tensor([[-1.0, -1.0], [1.0, 1.0], [2 * w2, 2 * w2]]))
    # statistics: the trajectory ratio per token; truncated = the tokens of row 1 (A < 0, ratio > 1)
    stats = out.stats
    assert stats["ratio_max"].item() == pytest.approx(math.exp(0.6))
    assert stats["ratio_min"].item() == pytest.approx(w2)
    assert stats["clip_frac_high"].item() == pytest.approx(2 / 6)
    assert stats["clip_frac_low"].item() == 0.0


def test_topr_sums_the_log_ratio_over_real_tokens_only():
    # row 0's second token is padding: its log-ratio (+5) must not enter the trajectory ratio
    log_probs = torch.tensor([[-1.0, 0.0], [-1.0, -1.0]], requires_grad=True)
    old = torch.tensor([[-0.5, -5.0], [-0.5, -0.5]])
    mask = torch.tensor([[1, 0], [1, 1]])
    out = TOPR()(log_probs, old, torch.tensor([-1.0, -1.0]), mask)
    out.loss.sum().backward()
    # row 0: log-ratio -0.5 -> w = e^-0.5; row 1: -1.0 -> w = e^-1; padding gets no gradient
    assert_close(log_probs.grad, torch.tensor([[math.exp(-0.5), 0.0], [math.exp(-1.0), math.exp(-1.0)]]))
    assert out.loss[0, 1].item() == 0.0


def test_topr_on_policy_is_reinforce():
    torch.manual_seed(0)
    log_probs = torch.randn(4, 5).log_softmax(-1).requires_grad_()
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]])
    adv = torch.tensor([1.5, -0.5, -1.0, 0.0])
    grads = []
    for loss, old in ((TOPR(), None), (TOPR(), log_probs.detach().clone()), (PolicyGradient(), None)):
        log_probs.grad = None
        scalar = aggregate_loss(loss(log_probs, old, adv, mask).loss, mask, "seq-mean-token-sum")
        scalar.backward()
        grads.append(log_probs.grad.clone())
    assert_close(grads[0], grads[2])
    assert_close(grads[1], grads[2])


def _paper_update(log_probs, old, adv, mask):
    """The paper's update per response, restated: with log pi(y) = sum_t log pi(y_t),
    ratio = (pi(y) / mu(y)).clamp(0, 1) if A < 0 else 1, loss = -sg(ratio) * A * log pi(y), averaged over responses."""
    losses = []
    for i in range(log_probs.shape[0]):
        real = mask[i].bool()
        log_pi, log_mu = log_probs[i][real].sum(), old[i][real].sum()
        ratio = torch.exp(log_pi - log_mu).clamp(0, 1).detach() if adv[i] < 0 else torch.tensor(1.0)
        losses.append(-ratio * adv[i] * log_pi)
    return torch.stack(losses).mean()


@pytest.mark.parametrize("seed", range(4))
def test_topr_with_seq_mean_token_sum_is_the_papers_update(seed):
    generator = torch.Generator().manual_seed(seed)
    log_probs = torch.randn(6, 7, generator=generator).log_softmax(-1).requires_grad_()
    old = (log_probs.detach() + 0.3 * torch.randn(6, 7, generator=generator)).clone()
    lengths = torch.randint(1, 8, (6,), generator=generator)
    mask = (torch.arange(7) < lengths.unsqueeze(-1)).long()
    adv = torch.randn(6, generator=generator)
    ours = aggregate_loss(TOPR()(log_probs, old, adv, mask).loss, mask, "seq-mean-token-sum")
    (grad_ours,) = torch.autograd.grad(ours, log_probs)
    theirs = _paper_update(log_probs, old, adv, mask)
    (grad_theirs,) = torch.autograd.grad(theirs, log_probs)
    assert_close(ours, theirs)
    assert_close(grad_ours, grad_theirs)


def test_topr_is_a_shorthand():
    assert isinstance(policy_loss("topr"), TOPR)

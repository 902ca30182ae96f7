"""Importance-Weighted On-Policy Distillation ("On the Position Bias of On-Policy Distillation", arXiv 2606.22600):
`prefix_drift_weights` and `distillation_loss(..., position_weight_gamma)`, by hand and against TRL's
``IWOPDTrainer._compute_iw_opd_loss`` restated (`trl_restated.py`)."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.losses.distillation import distillation_loss, prefix_drift_weights
from rlvr_lightning.core.losses.policy_losses import ImportanceRatio
from tests.core.trl_restated import trl_iw_opd_loss


def test_hand_computed_weights():
    # |drift| = 0.5, 1.0, 0.5: total 2.0, before each token 0, 0.5, 1.5 (exclusive), shares left 1, 0.75, 0.25;
    # w = 1 + 0.5 x share = 1.5, 1.375, 1.125 (gamma 0.5) and 1 + 2 x share = 3.0, 2.5, 1.5 (gamma 2)
    drift = torch.tensor([[0.5, -1.0, 0.5]])
    assert_close(prefix_drift_weights(drift, None, 0.5), torch.tensor([[1.5, 1.375, 1.125]]), rtol=0, atol=1e-7)
    assert_close(prefix_drift_weights(drift, None, 2.0), torch.tensor([[3.0, 2.5, 1.5]]), rtol=0, atol=1e-7)
    # rows are independent: a second row's drift does not move the first's weights
    two_rows = prefix_drift_weights(torch.tensor([[0.5, -1.0, 0.5], [0.0, 4.0, 0.0]]), None, 0.5)
    assert_close(two_rows, torch.tensor([[1.5, 1.375, 1.125], [1.5, 1.5, 1.0]]), rtol=0, atol=1e-7)


def test_a_later_update_weighs_by_the_rollout_drift_and_the_current_advantage():
    teacher = torch.tensor([[-1.0, -2.0, -1.0]])
    old = torch.tensor(
        [[-1.5, -1.0, -1.5]]
    )  # the rollout's drift teacher - old = 0.5, -1.0, 0.5: w = 1.5, 1.375, 1.125
    log_probs = torch.tensor([[-1.5, -1.0, -2.0]], requires_grad=True)  # the student moved on the third token
    out = distillation_loss(log_probs, old, teacher, None, position_weight_gamma=0.5)
    # A = teacher - sg(log_probs) = 0.5, -1.0, 1.0; r = exp(log_probs - old) = 1, 1, e^-0.5; l = -w A r
    # (the current drift 0.5, -1.0, 1.0 would give w = 1.5, 1.4, 1.2)
    expected = torch.tensor([[-0.75, 1.375, -1.125 * math.exp(-0.5)]])
    assert_close(out.loss, expected)
    assert_close(out.reverse_kl, torch.tensor([[-0.5, 1.0, -0.5]]))  # unweighted: log pi_old - log pi_teacher
    out.loss.sum().backward()
    assert_close(log_probs.grad, expected)  # d(-w A r)/d log pi = -w A r


def test_masked_tokens_add_no_drift_and_carry_no_loss():
    # the drifts of the hand-computed row with a masked token between them (a huge drift, -inf from the teacher)
    # and padding after them
    mask = torch.tensor([[1, 0, 1, 1, 0]])
    drift = torch.tensor([[0.5, 40.0, -1.0, 0.5, float("inf")]])
    assert_close(prefix_drift_weights(drift, mask, 0.5), torch.tensor([[1.5, 1.0, 1.375, 1.125, 1.0]]))
    teacher = torch.tensor([[-1.0, float("-inf"), -2.0, -1.0, float("-inf")]])
    log_probs = torch.tensor([[-1.5, -1.0, -1.0, -1.5, -3.0]], requires_grad=True)
    out = distillation_loss(log_probs, None, teacher, mask, position_weight_gamma=0.5)
    # the first update (r = 1): l = -w A = -1.5 x 0.5, 0, -1.375 x -1.0, -1.125 x 0.5, 0
    assert_close(out.loss, torch.tensor([[-0.75, 0.0, 1.375, -0.5625, 0.0]]))
    out.loss.sum().backward()
    assert torch.isfinite(log_probs.grad).all() and log_probs.grad[0, 1] == 0 and log_probs.grad[0, 4] == 0


def test_rows_without_drift_keep_finite_weights():
    # no drift at all (the student is the teacher): 0 / max(0, eps) = 0 before every token, so w = 1 + gamma
    assert_close(prefix_drift_weights(torch.zeros(1, 3), None, 0.5), torch.full((1, 3), 1.5), rtol=0, atol=0)
    # every token masked: weight 1, no NaN
    weights = prefix_drift_weights(torch.tensor([[0.5, -1.0]]), torch.zeros(1, 2), 0.5)
    assert torch.equal(weights, torch.ones(1, 2))
    log_probs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    out = distillation_loss(log_probs, None, log_probs.detach(), None, position_weight_gamma=0.5)
    assert torch.equal(out.loss, torch.zeros(1, 2))
    (grad,) = torch.autograd.grad(out.loss.sum(), log_probs)
    assert torch.equal(grad, torch.zeros(1, 2))


def random_rollout(generator, rows=4, length=7, vocab=9):
    """float64 logits, sampled tokens, teacher log-probs, and a mask with a masked token inside a row and
    padding (-inf from the teacher there)."""
    logits = torch.randn(rows, length, vocab, generator=generator, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(vocab, (rows, length), generator=generator)
    teacher = torch.log_softmax(2 * torch.randn(rows, length, vocab, generator=generator, dtype=torch.float64), -1)
    teacher = teacher.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    mask = torch.ones(rows, length, dtype=torch.bool)
    mask[0, 5:], mask[1, 2], mask[2, 1:] = False, False, False
    return logits, tokens, teacher.masked_fill(~mask, float("-inf")), mask


def token_log_probs(logits, tokens):
    return torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("gamma", [0.5, 2.0])
@pytest.mark.parametrize("rollout", ["given", "none"])
def test_matches_trl_iw_opd_at_the_first_update(gamma, rollout):
    """Value of the gradient w.r.t. the logits (the losses themselves differ by a constant: TRL's is
    -log pi x w A, ours -w A r) of the token-mean loss, the rollout's log-probs those of the current student."""
    logits, tokens, teacher, mask = random_rollout(torch.Generator().manual_seed(0))
    labels = tokens.masked_fill(~mask, -100)
    rollout_log_probs = token_log_probs(logits, tokens).detach() if rollout == "given" else None
    (expected,) = torch.autograd.grad(
        trl_iw_opd_loss(logits, tokens, labels, teacher, rollout_log_probs, gamma, 1e-8), logits
    )
    log_probs = token_log_probs(logits, tokens)
    out = distillation_loss(log_probs, rollout_log_probs, teacher, mask, position_weight_gamma=gamma)
    (ours,) = torch.autograd.grad(out.loss.sum() / mask.sum(), logits)
    assert_close(ours, expected, rtol=0, atol=1e-12)
    assert expected.abs().max() > 1e-3  # the comparison is not between zeros


def test_gamma_zero_is_the_unweighted_loss_bit_for_bit():
    logits, tokens, teacher, mask = random_rollout(torch.Generator().manual_seed(1))
    log_probs = token_log_probs(logits, tokens)
    old = log_probs.detach() + 0.1 * torch.randn(log_probs.shape, generator=torch.Generator().manual_seed(2))
    # the loss before the option: A = log nu - sg(log pi), masked, in the surrogate -A r of `ImportanceRatio`
    advantages = (teacher - log_probs.detach()).masked_fill(~mask, 0.0)
    unweighted = ImportanceRatio()(log_probs, old, advantages, mask).loss
    for out in (
        distillation_loss(log_probs, old, teacher, mask),
        distillation_loss(log_probs, old, teacher, mask, 0.0),
    ):
        assert torch.equal(out.loss, unweighted)
        (grad,) = torch.autograd.grad(out.loss.sum(), logits, retain_graph=True)
        (unweighted_grad,) = torch.autograd.grad(unweighted.sum(), logits, retain_graph=True)
        assert torch.equal(grad, unweighted_grad)


def test_a_negative_gamma_is_refused():
    with pytest.raises(ValueError, match="prefix_drift_weights: gamma must be >= 0, got -0.5"):
        prefix_drift_weights(torch.zeros(1, 2), None, -0.5)

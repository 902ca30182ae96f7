"""SAPO and VESPO against hand-computed examples."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.losses.policy_losses import PPOClip, policy_loss
from rlvr_lightning.core.losses.soft_losses import SAPO, VESPO

LN2 = math.log(2.0)
SIG1 = 1.0 / (1.0 + math.exp(-1.0))  # sigmoid(1) = 0.7311; sigmoid(-1) = 1 - SIG1


def _at_ratios(ratios):
    """log_probs = 0 (leaf, requires grad) and old_log_probs chosen so exp(logp - old) == ratios."""
    ratios = torch.tensor(ratios)
    log_probs = torch.zeros_like(ratios, requires_grad=True)
    return log_probs, -torch.log(ratios)


# ------------------------------------------------------------------ SAPO


def test_sapo_gate_value_and_gradient_by_hand():
    # row 0, A = +1, tau_pos = 1: r = 1 -> f = 4 sigmoid(0) = 2, grad -4 * 1/4 * 1 = -1;
    #                              r = 2 -> f = 4 sigmoid(1), grad -4 sigmoid(1)(1 - sigmoid(1)) * 2
    # row 1, A = -1, tau_neg = 2: r = .5 -> f = 4/2 sigmoid(2 * -.5) = 2 sigmoid(-1), loss = +f,
    #                              grad +4 sigmoid(-1)(1 - sigmoid(-1)) * .5; third tokens masked (garbage ratio)
    log_probs, old = _at_ratios([[1.0, 2.0, 1e6], [0.5, 0.5, 1e-6]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = SAPO(temperature_pos=1.0, temperature_neg=2.0)(log_probs, old, torch.tensor([1.0, -1.0]), mask)
    assert_close(out.loss, torch.tensor([[-2.0, -4 * SIG1, 0.0], [2 * (1 - SIG1), 0.0, 0.0]]))
    out.loss.sum().backward()
    slope = SIG1 * (1 - SIG1)  # sigmoid' at +-1
    assert_close(log_probs.grad, torch.tensor([[-1.0, -4 * slope * 2, 0.0], [4 * slope * 0.5, 0.0, 0.0]]))
    assert out.stats["ratio_max"].item() == pytest.approx(2.0)
    assert out.stats["clip_frac_high"].item() == 0.0  # nothing is clipped


def test_sapo_keeps_a_gradient_where_ppo_clips_it():
    # r = 2, A = +1: PPO's clip at 1.2 stops the gradient; SAPO only shrinks it (to 0.79 of the on-policy one)
    args = (*_at_ratios([[2.0]]), torch.tensor([1.0]), None)
    PPOClip()(*args).loss.sum().backward()
    assert args[0].grad.item() == 0.0
    args = (*_at_ratios([[2.0]]), torch.tensor([1.0]), None)
    SAPO()(*args).loss.sum().backward()
    assert args[0].grad.item() == pytest.approx(-8 * SIG1 * (1 - SIG1))


def test_sapo_defaults_are_the_papers():
    sapo = policy_loss("sapo")
    assert isinstance(sapo, SAPO) and (sapo.temperature_pos, sapo.temperature_neg) == (1.0, 1.05)


# ------------------------------------------------------------------ VESPO


def test_vespo_weight_value_and_gradient_by_hand():
    # row 0, A = +1, (k, lambda) = (2, 3): token log-ratios [ln 2, 0] -> W = 2 (a product, not a geometric mean),
    #        phi = 2^2 e^(3 (1 - 2)) = 4 e^-3; loss -phi A log p = phi * [ln 2, 2 ln 2]; grad -phi A
    # row 1, A = -1, (k, lambda) = (3, 2): log-ratios [ln .5, ln .5] -> W = .25, phi = .25^3 e^(2 * .75); grad +phi
    log_probs = torch.tensor([[-LN2, -2 * LN2], [-LN2, -LN2]], requires_grad=True)
    old = log_probs.detach() - torch.tensor([[LN2, 0.0], [-LN2, -LN2]])
    out = VESPO()(log_probs, old, torch.tensor([1.0, -1.0]), None)
    phi0, phi1 = 4 * math.exp(-3.0), 0.25**3 * math.exp(1.5)
    assert_close(out.loss, torch.tensor([[phi0 * LN2, phi0 * 2 * LN2], [-phi1 * LN2, -phi1 * LN2]]))
    out.loss.sum().backward()
    assert_close(log_probs.grad, torch.tensor([[-phi0, -phi0], [phi1, phi1]]))  # phi carries no gradient
    assert out.stats["ratio_max"].item() == pytest.approx(2.0) and out.stats["ratio_min"].item() == pytest.approx(0.25)
    assert out.stats["vespo_phi_mean"].item() == pytest.approx((phi0 + phi1) / 2)


def test_vespo_weight_peaks_at_k_over_lambda_and_vanishes_at_both_ends():
    def phi(weight):
        log_probs = torch.tensor([[-1.0]])
        return VESPO()(log_probs, log_probs - math.log(weight), torch.tensor([1.0]), None).loss.item()  # -phi * -1

    peak = phi(2 / 3)  # k / lambda for A >= 0
    assert peak == pytest.approx((2 / 3) ** 2 * math.exp(3 * (1 - 2 / 3)))
    assert phi(1.0) == pytest.approx(1.0)  # on-policy: REINFORCE
    assert phi(0.6) < peak and phi(0.7) < peak
    assert phi(1e-4) < 1e-6 and phi(20.0) < 1e-20


def test_vespo_folds_the_sampler_weights_into_the_sequence_weight():
    # W = 2 from the trainer; token weights [.5, 1] (or one sequence weight .5) make it 1: phi = 1, plain REINFORCE
    log_probs = torch.tensor([[-LN2, -LN2]])
    old = log_probs - torch.tensor([[LN2, 0.0]])
    adv = torch.tensor([1.0])
    token = VESPO().with_rollout_is(log_probs, old, adv, None, torch.tensor([[0.5, 1.0]]))
    sequence = VESPO().with_rollout_is(log_probs, old, adv, None, torch.tensor([[0.5]]))
    assert_close(token.loss, torch.tensor([[LN2, LN2]]))
    assert_close(sequence.loss, token.loss)
    # a rejected token (weight 0) counts as 1e-8: W = 2e-8, phi = W^2 e^(3 (1 - W))
    rejected = VESPO().with_rollout_is(log_probs, old, adv, None, torch.tensor([[0.0, 1.0]]))
    assert rejected.loss[0, 0].item() == pytest.approx((2e-8) ** 2 * math.exp(3 * (1 - 2e-8)) * LN2, rel=1e-4)


def test_vespo_masked_tokens_count_in_no_weight():
    log_probs = torch.tensor([[-LN2, -1.0]])
    old = log_probs - torch.tensor([[LN2, 7.0]])  # the masked token's log-ratio 7 must not enter W
    out = VESPO().with_rollout_is(log_probs, old, torch.tensor([1.0]), torch.tensor([[1, 0]]), torch.tensor([[1, 9.0]]))
    assert_close(out.loss, torch.tensor([[4 * math.exp(-3.0) * LN2, 0.0]]))


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: SAPO(temperature_pos=0.0), "SAPO: temperature_pos must be > 0, got 0.0"),
        (lambda: SAPO(temperature_neg=-1.0), "SAPO: temperature_neg must be > 0, got -1.0"),
        (lambda: VESPO(k_pos=-1.0), "VESPO: k_pos must be >= 0, got -1.0"),
        (lambda: VESPO(lambda_neg=0.0), "VESPO: lambda_neg must be > 0, got 0.0"),
    ],
)
def test_hyper_parameters_are_checked_when_built(build, match):
    with pytest.raises(ValueError, match=match):
        build()

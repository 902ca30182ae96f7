import math

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.kl import K1, K3, K3IS, KL_ESTIMATORS, KLEstimator, kl_estimator

LN2 = math.log(2.0)
P = torch.tensor([[math.log(0.5)]])  # policy
Q = torch.tensor([[math.log(0.25)]])  # reference; d = log q - log p = -ln 2


def test_hand_values_policy_above_reference():
    assert_close(kl_estimator("k1").estimate(P, Q), torch.tensor([[LN2]]))  # 0.6931
    assert_close(kl_estimator("k2").estimate(P, Q), torch.tensor([[0.5 * LN2**2]]))  # 0.2402
    assert_close(kl_estimator("k3").estimate(P, Q), torch.tensor([[0.5 + LN2 - 1.0]]))  # 0.1931


def test_hand_values_policy_below_reference():
    # d = +ln 2: k1 = -ln 2 (negative is allowed), k3 = 2 - ln 2 - 1 = 0.3069
    assert_close(kl_estimator("k1").estimate(Q, P), torch.tensor([[-LN2]]))
    assert_close(kl_estimator("k2").estimate(Q, P), torch.tensor([[0.5 * LN2**2]]))
    assert_close(kl_estimator("k3").estimate(Q, P), torch.tensor([[2.0 - LN2 - 1.0]]))


def test_k3_called_directly():
    assert_close(K3()(P, Q), torch.tensor([[0.5 + LN2 - 1.0]]))


def test_zero_when_equal_and_k3_non_negative():
    logp = torch.linspace(-5.0, 0.0, 11).view(1, -1)
    for kind in KL_ESTIMATORS:
        assert torch.count_nonzero(kl_estimator(kind)(logp, logp)) == 0
    ref = torch.linspace(-10.0, 0.0, 11).view(1, -1)
    assert (kl_estimator("k3").estimate(logp, ref) >= 0).all()
    assert (kl_estimator("k3").estimate(ref, logp) >= 0).all()


def test_k3_gradient():
    # d k3 / d logp = 1 - exp(d) = 1 - 1/2
    logp = P.clone().requires_grad_(True)
    kl_estimator("k3").estimate(logp, Q).sum().backward()
    assert_close(logp.grad, torch.tensor([[0.5]]))


def test_clamp():
    # d = 20: k3 = e^20 - 21 -> 10 ; k1 = -20 -> -10
    logp = torch.tensor([[-20.0]])
    ref = torch.tensor([[0.0]])
    assert kl_estimator("k3").estimate(logp, ref, clamp=10.0).item() == 10.0
    assert kl_estimator("k1").estimate(logp, ref, clamp=10.0).item() == -10.0
    with pytest.raises(ValueError, match="clamp"):
        kl_estimator("k3").estimate(logp, ref, clamp=0.0)


def test_unknown_kind_lists_choices():
    with pytest.raises(ValueError, match=r"kl.estimator='k4'.*'k1', 'k2', 'k3'"):
        kl_estimator("k4")


def test_an_estimator_of_ones_own():
    class Squared(KLEstimator):
        def __call__(self, log_probs, ref_log_probs):
            return (ref_log_probs - log_probs) ** 2

    estimator = Squared()
    assert kl_estimator(estimator) is estimator
    assert_close(estimator.estimate(P, Q), torch.tensor([[LN2**2]]))
    assert estimator.estimate(torch.tensor([[-5.0]]), torch.tensor([[0.0]]), clamp=10.0).item() == 10.0
    assert isinstance(kl_estimator("k1"), K1)


@pytest.mark.parametrize("d", [89.0, 1000.0, -1000.0])
def test_clamped_k3_gradient_is_finite_where_exp_overflows(d):
    # float32 exp overflows beyond d = 88.7; clamping d to [-20, 20] first (verl) keeps the value at the
    # clamp and the gradient at 0 (both clamps saturate) instead of 0 * inf = NaN
    logp = torch.tensor([[-d / 2, 0.0]], requires_grad=True)
    ref = torch.tensor([[d / 2, 0.0]])  # d = ref - logp on the first token, 0 on the second
    kl = kl_estimator("k3").estimate(logp, ref, clamp=10.0)
    kl.sum().backward()
    assert kl[0, 0].item() == 10.0 and kl[0, 1].item() == 0.0
    assert torch.isfinite(logp.grad).all()
    assert logp.grad.tolist() == [[0.0, 0.0]]


def test_log_ratio_clamp_leaves_values_inside_the_range_alone():
    # inside [-20, 20] the clamped k3 equals the plain one (up to the value clamp): d = 2 -> e^2 - 3 = 4.389
    logp = torch.tensor([[-2.0]], requires_grad=True)
    kl = K3().estimate(logp, torch.tensor([[0.0]]), clamp=10.0)
    kl.sum().backward()
    assert_close(kl, torch.tensor([[math.exp(2.0) - 3.0]]))
    assert_close(logp.grad, torch.tensor([[1.0 - math.exp(2.0)]]))  # d k3 / d logp = 1 - e^d


def test_k3_is_hand_values():
    # old = ln 0.25: r = 0.5 / 0.25 = 2; k3 = 0.5 + ln 2 - 1; KL_t = 2 k3 = 2 ln 2 - 1
    logp = P.clone().requires_grad_(True)
    kl = kl_estimator("k3_is").estimate(logp, Q, old_log_probs=Q)
    assert_close(kl, torch.tensor([[2 * LN2 - 1.0]]))
    # d(r k3)/d logp = r k3 + r (1 - exp(d)) = (2 ln 2 - 1) + 2 (1 - 1/2) = 2 ln 2
    kl.sum().backward()
    assert_close(logp.grad, torch.tensor([[2 * LN2]]))
    # at the sampling policy its value is k3's, its gradient k3 + (1 - exp(d)) = ln 2 (k3's own: 1/2)
    logp.grad = None
    kl = kl_estimator("k3_is").estimate(logp, Q)
    assert_close(kl, torch.tensor([[0.5 + LN2 - 1.0]]))
    kl.sum().backward()
    assert_close(logp.grad, torch.tensor([[LN2]]))
    assert K3IS.needs_old_log_probs and not K3.needs_old_log_probs


def test_k3_is_is_unbiased_off_policy_where_k3_is_not():
    """Exact expectation over a 6-token vocabulary of tokens sampled from pi_old != pi_theta: value and gradient of
    KL(pi_theta || pi_ref) for k3_is (1e-10, float64); k3 alone is off by the sampling mismatch."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 6, generator=generator, dtype=torch.float64, requires_grad=True)
    old = torch.log_softmax(logits.detach() + torch.randn(4, 6, generator=generator), -1)
    ref = torch.log_softmax(torch.randn(4, 6, generator=generator, dtype=torch.float64), -1)
    log_p = torch.log_softmax(logits, -1)
    exact = (log_p.exp() * (log_p - ref)).sum()
    (exact_grad,) = torch.autograd.grad(exact, logits)
    for name, unbiased in (("k3_is", True), ("k3", False)):
        expected = (old.exp() * kl_estimator(name).estimate(torch.log_softmax(logits, -1), ref, None, old)).sum()
        (grad,) = torch.autograd.grad(expected, logits)
        assert torch.allclose(expected, exact, rtol=0, atol=1e-10) == unbiased
        assert torch.allclose(grad, exact_grad, rtol=0, atol=1e-10) == unbiased

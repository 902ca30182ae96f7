import math

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.losses.distillation import distillation_loss, reverse_kl_advantages

LN2, LN1_5 = math.log(2.0), math.log(1.5)


def tiny_models():
    """A student (logits 0, 0: p = 1/2, 1/2) and a teacher (logits ln 3, 0: q = 3/4, 1/4) over two tokens."""
    student_logits = torch.zeros(1, 1, 2, dtype=torch.float64, requires_grad=True)
    teacher_logits = torch.tensor([[[math.log(3.0), 0.0]]], dtype=torch.float64)
    return student_logits, teacher_logits


def scored(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize(
    "token, loss, grad",
    [
        # log p - log q = -ln 2 - ln 3/4 = -ln 1.5; d/dz of sg(-ln 1.5) * log p(0) = -ln 1.5 * ((1, 0) - (1/2, 1/2))
        (0, -LN1_5, [-LN1_5 / 2, LN1_5 / 2]),
        # log p - log q = -ln 2 - ln 1/4 = ln 2; d/dz = ln 2 * ((0, 1) - (1/2, 1/2))
        (1, LN2, [-LN2 / 2, LN2 / 2]),
    ],
)
def test_hand_computed_loss_and_gradient(token, loss, grad):
    student_logits, teacher_logits = tiny_models()
    tokens = torch.tensor([[token]])
    out = distillation_loss(scored(student_logits, tokens), None, scored(teacher_logits, tokens), None)
    assert_close(out.loss, torch.tensor([[loss]], dtype=torch.float64))  # the first update: the estimate itself
    assert_close(out.reverse_kl, torch.tensor([[loss]], dtype=torch.float64))
    out.loss.sum().backward()
    assert_close(student_logits.grad, torch.tensor([[grad]], dtype=torch.float64))


def test_its_expected_gradient_is_the_reverse_kl_gradient():
    """Weighted by how often the student samples each token, the per-token gradients sum to the gradient of the
    full-vocabulary KL(student || teacher): the sampled estimate is unbiased."""
    torch.manual_seed(0)
    student_logits = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)  # 3 positions, 5 tokens
    teacher_log_probs = torch.log_softmax(torch.randn(3, 5, dtype=torch.float64), -1)
    expected = torch.zeros(3, 5, dtype=torch.float64)
    for token in range(5):
        tokens = torch.full((3,), token)
        log_probs = torch.log_softmax(student_logits, -1)[torch.arange(3), tokens].unsqueeze(0)
        loss = distillation_loss(log_probs, None, teacher_log_probs[torch.arange(3), tokens].unsqueeze(0), None).loss
        weight = torch.softmax(student_logits, -1)[torch.arange(3), tokens].detach()
        (grad,) = torch.autograd.grad((weight * loss.squeeze(0)).sum(), student_logits)
        expected += grad
    log_p = torch.log_softmax(student_logits, -1)
    full_kl = (log_p.exp() * (log_p - teacher_log_probs)).sum()
    (exact,) = torch.autograd.grad(full_kl, student_logits)
    assert_close(expected, exact)


def test_teacher_equal_to_student_gives_zero_loss_and_zero_gradient():
    torch.manual_seed(0)
    log_probs = torch.log_softmax(torch.randn(2, 4, 6), -1)[..., 0].clone().requires_grad_(True)
    old = log_probs.detach() - 0.3  # a later update: the policy moved since it sampled; the teacher is the sampler
    for old_log_probs in (None, old):  # the first update, and a later one: the student is the teacher now
        out = distillation_loss(log_probs, old_log_probs, log_probs.detach(), None)
        assert torch.count_nonzero(out.loss) == 0
        assert torch.count_nonzero(out.reverse_kl) == (0 if old_log_probs is None else out.reverse_kl.numel())
        (grad,) = torch.autograd.grad(out.loss.sum(), log_probs)
        assert torch.count_nonzero(grad) == 0


def test_a_later_update_weighs_the_sampled_advantage_by_the_ratio():
    log_probs = torch.tensor([[math.log(0.5), math.log(0.2)]], requires_grad=True)
    old = torch.tensor([[math.log(0.25), math.log(0.2)]])
    teacher = torch.tensor([[math.log(0.5), math.log(0.4)]])
    out = distillation_loss(log_probs, old, teacher, None)
    # A = log q - sg(log p) = (0, ln 2) at the current student; ratio = (2, 1): l = -A r
    assert_close(out.loss, torch.tensor([[0.0, -LN2]]))
    assert_close(out.reverse_kl, torch.tensor([[-LN2, -LN2]]))  # log p_old - log q, at the sampling policy
    out.loss.sum().backward()
    assert_close(log_probs.grad, torch.tensor([[0.0, -LN2]]))  # d(-A r)/d log p = -A r
    assert_close(reverse_kl_advantages(old, teacher), torch.tensor([[LN2, LN2]]))


def test_masked_tokens_are_exactly_zero_and_shapes_are_checked():
    log_probs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    teacher = torch.tensor([[-1.5, float("-inf")]])  # a token the teacher rules out, masked away
    out = distillation_loss(log_probs, None, teacher, torch.tensor([[1.0, 0.0]]))
    assert_close(out.loss, torch.tensor([[0.5, 0.0]]))
    out.loss.sum().backward()
    assert torch.isfinite(log_probs.grad).all() and log_probs.grad[0, 1] == 0
    with pytest.raises(ValueError, match=r"teacher_log_probs shape \(1, 3\) != log_probs shape \(1, 2\)"):
        distillation_loss(log_probs, None, torch.zeros(1, 3), None)


def full_vocabulary_loss(student_logits, old_log_probs, teacher_log_probs):
    """The distillation loss's exact expectation over tokens sampled from the old policy: every token of the
    vocabulary at every position, weighted by its old probability (``[P, V]`` logits and log-probs)."""
    log_probs = torch.log_softmax(student_logits, -1)
    loss = distillation_loss(log_probs, old_log_probs, teacher_log_probs, None).loss
    return (old_log_probs.exp() * loss).sum()


def test_after_the_student_moved_the_expected_gradient_is_still_the_reverse_kl_gradient():
    """A later update of a rollout (epochs > 1, mini-batches): tokens sampled from pi_old, the student at pi."""
    generator = torch.Generator().manual_seed(0)
    student_logits = torch.randn(3, 5, generator=generator, dtype=torch.float64, requires_grad=True)
    old_log_probs = torch.log_softmax(student_logits.detach() + torch.randn(3, 5, generator=generator), -1)
    teacher_log_probs = torch.log_softmax(torch.randn(3, 5, generator=generator, dtype=torch.float64), -1)
    (expected,) = torch.autograd.grad(
        full_vocabulary_loss(student_logits, old_log_probs, teacher_log_probs), student_logits
    )
    log_p = torch.log_softmax(student_logits, -1)
    # grad KL(pi || nu) = grad sum_y pi(y) (log pi(y) - log nu(y))
    (exact,) = torch.autograd.grad((log_p.exp() * (log_p - teacher_log_probs)).sum(), student_logits)
    assert_close(expected, exact, rtol=0, atol=1e-10)


def reverse_kl_per_rollout(epochs: int, rollouts: int, lr: float = 5.0) -> list[float]:
    """SGD on a 3-position, 5-token student distilled from a fixed teacher, each rollout's loss its exact
    expectation under the sampling policy, `epochs` updates per rollout; KL(pi || nu) after each rollout."""
    generator = torch.Generator().manual_seed(0)
    student_logits = torch.randn(3, 5, generator=generator, dtype=torch.float64, requires_grad=True)
    teacher_log_probs = torch.log_softmax(2 * torch.randn(3, 5, generator=generator, dtype=torch.float64), -1)
    kls = []
    for _ in range(rollouts):
        old_log_probs = torch.log_softmax(student_logits.detach(), -1)
        for _ in range(epochs):
            loss = full_vocabulary_loss(student_logits, old_log_probs, teacher_log_probs)
            (grad,) = torch.autograd.grad(loss, student_logits)
            with torch.no_grad():
                student_logits -= lr * grad
        log_p = torch.log_softmax(student_logits.detach(), -1)
        kls.append(float((log_p.exp() * (log_p - teacher_log_probs)).sum()))
    return kls


def test_two_epochs_per_rollout_lower_the_reverse_kl_at_least_as_fast_as_one():
    one, two = reverse_kl_per_rollout(epochs=1, rollouts=10), reverse_kl_per_rollout(epochs=2, rollouts=5)
    assert all(b <= a for a, b in zip(one[: len(two)], two, strict=True))  # after as many rollouts
    # exact gradients: a second epoch is the next rollout's update, so 2 epochs x 5 rollouts retrace 1 x 10
    assert_close(torch.tensor(two), torch.tensor(one[1::2]), rtol=0, atol=1e-10)

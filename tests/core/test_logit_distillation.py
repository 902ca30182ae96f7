"""Logit-level distillation (`core/losses/logit_distillation.py`): the divergences by hand, the tail bucket, the
top-k loss against TRL's formulas restated, and its whole-vocabulary limit."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from rlvr_lightning.core.losses.logit_distillation import (
    generalized_jsd,
    renormalised,
    top_k_distillation_loss,
    with_tail,
)


def kl(p: list[float], q: list[float]) -> float:
    return sum(a * math.log(a / b) for a, b in zip(p, q, strict=True))


S, T = [0.5, 0.5], [0.9, 0.1]


def logs(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).log()


@pytest.mark.parametrize("alpha", [0.0, 0.25, 0.5, 1.0])
def test_the_generalised_jsd_by_hand(alpha):
    if alpha == 0.0:
        expected = kl(T, S)  # forward KL(teacher || student) = 0.9 ln 1.8 + 0.1 ln 0.2
    elif alpha == 1.0:
        expected = kl(S, T)  # reverse KL(student || teacher) = 0.5 ln(0.5 / 0.9) + 0.5 ln 5
    else:
        mixture = [(1 - alpha) * s + alpha * t for s, t in zip(S, T, strict=True)]
        expected = (1 - alpha) * kl(S, mixture) + alpha * kl(T, mixture)
    assert generalized_jsd(logs(S), logs(T), alpha).item() == pytest.approx(expected, abs=1e-12)


def test_hand_numbers_of_the_end_points():
    assert kl(T, S) == pytest.approx(0.9 * math.log(1.8) + 0.1 * math.log(0.2))
    assert generalized_jsd(logs(S), logs(T), 1.0).item() == pytest.approx(0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(5))
    # the JSD of alpha 0.5 is symmetric and at most ln 2
    jsd = generalized_jsd(logs(S), logs(T), 0.5).item()
    assert jsd == pytest.approx(generalized_jsd(logs(T), logs(S), 0.5).item()) and 0 < jsd < math.log(2)
    with pytest.raises(ValueError, match="alpha must be in"):
        generalized_jsd(logs(S), logs(T), 1.5)


def test_the_tail_bucket_and_renormalisation():
    top = logs([0.5, 0.2])
    torch.testing.assert_close(with_tail(top).exp(), torch.tensor([0.5, 0.2, 0.3], dtype=torch.float64))
    torch.testing.assert_close(renormalised(top).exp(), torch.tensor([5 / 7, 2 / 7], dtype=torch.float64))


def trl_topk_loss(student_top: torch.Tensor, teacher_top: torch.Tensor, alpha: float, add_tail: bool) -> torch.Tensor:
    """TRL `compute_topk_self_distillation_loss` after the support is chosen (its top-k gathers), restated."""
    if add_tail:

        def tail(lp):
            log_s = torch.logsumexp(lp, dim=-1, keepdim=True).clamp(max=-1e-7)
            return torch.cat([lp, torch.log(-torch.expm1(log_s))], dim=-1)

        student_top, teacher_top = tail(student_top), tail(teacher_top)
    else:
        student_top = student_top - torch.logsumexp(student_top, dim=-1, keepdim=True)
        teacher_top = teacher_top - torch.logsumexp(teacher_top, dim=-1, keepdim=True)
    if alpha == 0.0:
        return F.kl_div(student_top, teacher_top, reduction="none", log_target=True).sum(-1)
    if alpha == 1.0:
        return F.kl_div(teacher_top, student_top, reduction="none", log_target=True).sum(-1)
    a = torch.tensor(alpha, dtype=student_top.dtype)
    mixture = torch.logsumexp(torch.stack([student_top + torch.log(1 - a), teacher_top + torch.log(a)]), dim=0)
    kl_t = F.kl_div(mixture, teacher_top, reduction="none", log_target=True)
    kl_s = F.kl_div(mixture, student_top, reduction="none", log_target=True)
    return torch.lerp(kl_s, kl_t, alpha).sum(-1)


@pytest.mark.parametrize("add_tail", [False, True])
@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_top_k_loss_against_trl_restated_on_the_teacher_s_support(alpha, add_tail):
    g = torch.Generator().manual_seed(0)
    student_logits = torch.randn(3, 4, 11, generator=g, dtype=torch.float64, requires_grad=True)
    teacher_logits = torch.randn(3, 4, 11, generator=g, dtype=torch.float64)
    teacher = torch.log_softmax(teacher_logits, -1)
    teacher_top, ids = teacher.topk(5, dim=-1)

    def student_top():
        return torch.log_softmax(student_logits, -1).gather(-1, ids)

    ours = top_k_distillation_loss(student_top(), teacher_top, None, alpha, add_tail)
    (grad_ours,) = torch.autograd.grad(ours.sum(), student_logits)
    theirs = trl_topk_loss(student_top(), teacher_top, alpha, add_tail)
    (grad_theirs,) = torch.autograd.grad(theirs.sum(), student_logits)
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=0)
    torch.testing.assert_close(grad_ours, grad_theirs, atol=1e-12, rtol=0)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_a_support_of_the_whole_vocabulary_is_the_whole_divergence(alpha):
    """k = V: TRL's `compute_full_logit_self_distillation_loss`, and for alpha 1 the gradient of KL(S || T) in the
    student's logits by hand, p_s (log p_s - log p_t - KL)."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 7, generator=g, dtype=torch.float64, requires_grad=True)
    teacher = torch.log_softmax(torch.randn(2, 3, 7, generator=g, dtype=torch.float64), -1)
    teacher_top, ids = teacher.topk(7, dim=-1)
    loss = top_k_distillation_loss(torch.log_softmax(logits, -1).gather(-1, ids), teacher_top, None, alpha)
    torch.testing.assert_close(loss, trl_topk_loss(torch.log_softmax(logits, -1), teacher, alpha, False))
    if alpha == 1.0:
        (grad,) = torch.autograd.grad(loss.sum(), logits)
        student = torch.log_softmax(logits, -1).detach()
        divergence = (student.exp() * (student - teacher)).sum(-1, keepdim=True)
        torch.testing.assert_close(grad, student.exp() * (student - teacher - divergence), atol=1e-12, rtol=0)


def test_mask_and_ratio_clip():
    student = logs([0.5, 0.3]).expand(2, 3, 2).clone().requires_grad_(True)
    teacher = logs([0.2, 0.6]).expand(2, 3, 2)
    one = generalized_jsd(renormalised(student[0, 0]), renormalised(teacher[0, 0]), 1.0).item()
    mask = torch.tensor([[True, True, False], [True, False, False]])
    current = torch.zeros(2, 3, dtype=torch.float64)
    old = torch.tensor([[-math.log(3), math.log(2), 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    loss = top_k_distillation_loss(student, teacher, mask, ratio_clip=(current, old, 2.0))
    # ratios pi / pi_old: 3 (clipped to 2), 1/2, and 1; masked positions 0
    expected = torch.tensor([[2 * one, 0.5 * one, 0.0], [one, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(loss.detach(), expected, atol=1e-12, rtol=0)
    (grad,) = torch.autograd.grad(loss.sum(), student)
    assert bool((grad[~mask] == 0).all()) and bool((grad[mask] != 0).any())

"""On-policy distillation: a teacher scores the student's own samples token by token.

The objective is the reverse KL from the student to the teacher on the student's samples,
``KL(pi_student || pi_teacher)`` summed over response tokens. Its sampled estimate at one token is
``log pi_student(y_t) - log pi_teacher(y_t)`` (the k1 estimator of `core/kl.py`); used with the opposite
sign as a per-token advantage ``A_t = log pi_teacher(y_t) - sg(log pi(y_t))`` at the CURRENT student
(no discounting: each token answers for itself) in the importance-weighted policy-gradient surrogate
``-A_t * r_t``, ``r_t = pi / pi_old``, its expected gradient over ``y_t ~ pi_old`` is
``sum_y pi(y) (log pi(y) - log pi_teacher(y)) grad log pi(y)``, the exact gradient of the per-token reverse
KL (``sum_y grad pi(y) = 0`` removes the term the stop-gradient drops), at every update of a rollout. An
advantage fixed when the rollout was sampled (``log pi_teacher - log pi_old``) would be exact at the first
update only: once the student has moved its expected gradient is ``grad [KL(pi || teacher) - KL(pi || pi_old)]``.
With ``ratio = 1`` (the first update) the loss is the estimate itself, so teacher = student gives exactly 0
and no gradient.

Inputs (shapes of `rlvr_lightning.rollout`): ``log_probs`` ``[N, T]`` differentiable,
``old_log_probs`` ``[N, T]`` of the policy that sampled (None: ``log_probs.detach()``, the first update),
``teacher_log_probs`` ``[N, T]`` (no grad), ``mask`` ``[N, T]`` or None (every token is real).
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from rlvr_lightning.core.losses.policy_losses import ImportanceRatio


class DistillationOutput(NamedTuple):
    loss: Tensor  # [N, T] per-token loss, 0 where mask is 0, not aggregated
    reverse_kl: Tensor  # [N, T] detached sampled estimate at the sampling policy, log pi_old - log pi_teacher (metrics)


def reverse_kl_advantages(student_log_probs: Tensor, teacher_log_probs: Tensor) -> Tensor:
    """``[N, T]`` per-token advantages: minus the sampled reverse KL of each token."""
    # A_t = -(log pi_student(y_t) - log pi_teacher(y_t))  (Thinking Machines 2025, "On-Policy Distillation";
    # the on-policy reverse-KL case of GKD, Agarwal et al. 2024, lambda = 1, beta = 1; sampled, not full-vocabulary)
    return teacher_log_probs - student_log_probs


def distillation_loss(
    log_probs: Tensor, old_log_probs: Tensor | None, teacher_log_probs: Tensor, mask: Tensor | None
) -> DistillationOutput:
    """The per-token on-policy distillation loss (module docstring) and the per-token reverse-KL estimate."""
    if teacher_log_probs.shape != log_probs.shape:
        raise ValueError(
            f"teacher_log_probs shape {tuple(teacher_log_probs.shape)} != log_probs shape {tuple(log_probs.shape)}"
        )
    old = log_probs.detach() if old_log_probs is None else old_log_probs.detach()
    teacher = teacher_log_probs.detach()
    # A_t = log nu - sg(log pi_theta): the current student, not the sampler, so that the expected gradient stays
    # grad KL(pi || nu) after the first update (verl verl/trainer/distillation/losses.py, use_policy_gradient:
    # advantages = -distillation_losses.detach() of the current forward)
    advantages = reverse_kl_advantages(log_probs.detach(), teacher)
    sampled_kl = -reverse_kl_advantages(old, teacher)
    if mask is not None:  # what a teacher says about padding (even -inf) must not reach the gradient as 0 * inf
        advantages = advantages.masked_fill(~mask.bool(), 0.0)
        sampled_kl = sampled_kl.masked_fill(~mask.bool(), 0.0)
    # l_t = -A_t * r_t, r_t = pi / pi_old  (the importance-sampling surrogate of `ImportanceRatio`)
    output = ImportanceRatio()(log_probs, old, advantages, mask)
    return DistillationOutput(output.loss, sampled_kl)

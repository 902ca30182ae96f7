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

``position_weight_gamma > 0`` is Importance-Weighted On-Policy Distillation (IW-OPD): each token's advantage is
multiplied by a weight in ``[1, 1 + gamma]`` that falls with the teacher-student drift accumulated before the token
in its row (`prefix_drift_weights`). The drift is the rollout's, ``log pi_teacher - log pi_old``, so every update of
a rollout weighs the same tokens alike; tokens after most of a row's drift get weight about 1.

``future_gamma > 0`` is MiniLLM's long-term part (Gu et al. 2024, "MiniLLM: Knowledge Distillation of Large Language
Models", arXiv:2306.08543; TRL's `MiniLLMTrainer` `gamma`): each token's advantage is the discounted sum of the
per-token advantages from it to the end of its response (`discounted_future_sum`), with ``length_normalization``
divided by the sum of the discounts over those tokens.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
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


@torch.no_grad()
def prefix_drift_weights(drift: Tensor, mask: Tensor | None, gamma: float, eps: float = 1e-8) -> Tensor:
    """``[N, T]`` detached IW-OPD weights of the per-token ``drift`` (``log pi_teacher - log pi_rollout``); a masked
    token adds nothing to its row's drift and gets weight 1. ``eps`` bounds the divisor of a row without drift."""
    if gamma < 0:
        raise ValueError(f"prefix_drift_weights: gamma must be >= 0, got {gamma}")
    size = drift.abs() if mask is None else drift.abs().masked_fill(~mask.bool(), 0.0)
    # w_t = 1 + gamma (1 - sum_{s<t} |A_s| / max(sum_s |A_s|, eps))  (arXiv 2606.22600; TRL _compute_iw_opd_loss)
    before = size.cumsum(dim=-1) - size
    total = size.sum(dim=-1, keepdim=True).clamp_min(eps)
    weights = 1.0 + gamma * (1.0 - before / total)
    return weights if mask is None else weights.masked_fill(~mask.bool(), 1.0)


def discounted_future_sum(values: Tensor, mask: Tensor | None, gamma: float, length_normalization: bool) -> Tensor:
    """``[N, T]``: at each token the sum over its row's tokens from it on of ``gamma^(i - t) values_i`` (masked tokens
    add 0); with ``length_normalization`` divided by the sum of ``gamma^(i - t)`` over the row's unmasked tokens from
    it on (a masked token's divisor is kept from 0)."""
    # A_t = sum_{i>=t} gamma^(i-t) R_i / sum_{i>=t} gamma^(i-t) m_i  (MiniLLM, arXiv:2306.08543 eq. 6 with its length
    # normalisation; TRL MiniLLMTrainer._compute_advantage, whose unnormalised form also carries a factor gamma^t)
    real = torch.ones_like(values) if mask is None else mask.to(values.dtype)
    sums, divisors = torch.zeros_like(values), torch.zeros_like(values)
    running, running_divisor = torch.zeros_like(values[:, 0]), torch.zeros_like(values[:, 0])
    for t in range(values.shape[1] - 1, -1, -1):  # T is a response's length: a loop of T small ops
        running = values[:, t] * real[:, t] + gamma * running
        running_divisor = real[:, t] + gamma * running_divisor
        sums[:, t], divisors[:, t] = running, running_divisor
    return sums / divisors.clamp_min(1e-4) if length_normalization else sums


def distillation_loss(
    log_probs: Tensor,
    old_log_probs: Tensor | None,
    teacher_log_probs: Tensor,
    mask: Tensor | None,
    position_weight_gamma: float = 0.0,
    future_gamma: float = 0.0,
    length_normalization: bool = True,
) -> DistillationOutput:
    """The per-token on-policy distillation loss (module docstring) and the per-token reverse-KL estimate;
    ``position_weight_gamma > 0`` weighs each token's advantage by `prefix_drift_weights` of the rollout's drift;
    ``future_gamma > 0`` makes it the discounted sum of the advantages from it on (MiniLLM)."""
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
    if future_gamma != 0:  # 0: each token answers for itself, bit for bit
        advantages = discounted_future_sum(advantages, mask, future_gamma, length_normalization)
    if position_weight_gamma != 0:  # 0: no weights at all, so that the loss is bit for bit the unweighted one
        # A_t <- w_t A_t, w_t from the rollout's drift log nu - log pi_old  (arXiv 2606.22600, IW-OPD)
        advantages = prefix_drift_weights(-sampled_kl, mask, position_weight_gamma) * advantages
    # l_t = -A_t * r_t, r_t = pi / pi_old  (the importance-sampling surrogate of `ImportanceRatio`)
    output = ImportanceRatio()(log_probs, old, advantages, mask)
    return DistillationOutput(output.loss, sampled_kl)

"""Logit-level distillation: a divergence between the student's and the teacher's distributions at each position,
over the teacher's top-k tokens, instead of the sampled-token estimate of `core/losses/distillation.py`.

At each response position the teacher names its k most probable tokens and their log-probs; the student's
log-probs of the same tokens (differentiable) are compared with them as two distributions over those k tokens,
either renormalised (the divergence of the two distributions conditioned on the top-k) or with one more
category holding the rest of each side's mass (`add_tail`: a k + 1-category approximation of the whole-vocabulary
divergence). The divergence is the generalised Jensen-Shannon divergence of GKD (Agarwal et al. 2024), with its
end points: ``alpha = 0`` the forward KL ``KL(teacher || student)``, ``alpha = 1`` the reverse KL
``KL(student || teacher)`` (TRL `trl/experimental/sdpo/loss_utils.py`, `compute_divergence`).

The divergence at a position is an exact function of the student's distribution there, so its gradient needs no
policy-gradient estimate; the responses were sampled by the student, which makes the loss on-policy. The teacher's
support is the one an inference server returns (TRL's teacher-server mode); TRL's local trainers take the
student's top-k instead, which needs the teacher's whole distribution at update time.

Inputs (shapes of `rlvr_lightning.rollout`, k the support's size): ``student`` ``[N, T, k]`` differentiable
log-probs of the support tokens, ``teacher`` ``[N, T, k]`` (no grad), ``mask`` ``[N, T]`` or None.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def generalized_jsd(student: Tensor, teacher: Tensor, alpha: float) -> Tensor:
    """``[...]`` the divergence between the distributions of log-probs ``student`` and ``teacher`` ``[..., K]``:
    ``(1 - alpha) KL(S || M) + alpha KL(T || M)`` with ``M = (1 - alpha) S + alpha T``, and ``alpha`` 0 / 1 the
    forward / reverse KL."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"generalized_jsd: alpha must be in [0, 1], got {alpha}")
    # F.kl_div(input, target, log_target=True) = exp(target) (target - input) pointwise: KL(target || input)
    if alpha == 0.0:  # KL(T || S)  (TRL compute_divergence, alpha = 0)
        kl = F.kl_div(student, teacher, reduction="none", log_target=True)
    elif alpha == 1.0:  # KL(S || T)  (TRL compute_divergence, alpha = 1)
        kl = F.kl_div(teacher, student, reduction="none", log_target=True)
    else:  # GKD's generalised JSD (Agarwal et al. 2024, eq. 3; TRL compute_divergence)
        mixture = torch.logsumexp(torch.stack([student + math.log(1 - alpha), teacher + math.log(alpha)]), dim=0)
        kl_teacher = F.kl_div(mixture, teacher, reduction="none", log_target=True)
        kl_student = F.kl_div(mixture, student, reduction="none", log_target=True)
        kl = torch.lerp(kl_student, kl_teacher, alpha)
    return kl.sum(-1)


def with_tail(log_probs: Tensor) -> Tensor:
    """``[..., K + 1]``: the top-k log-probs ``[..., K]`` and the log of the mass they leave, ``log(1 - sum p)``."""
    captured = torch.logsumexp(log_probs, dim=-1, keepdim=True).clamp(max=-1e-7)
    # log(1 - P_topk) = log(-expm1(log P_topk))  (TRL add_tail_bucket)
    return torch.cat([log_probs, torch.log(-torch.expm1(captured))], dim=-1)


def renormalised(log_probs: Tensor) -> Tensor:
    """The top-k log-probs as a distribution over the k tokens alone."""
    return log_probs - torch.logsumexp(log_probs, dim=-1, keepdim=True)


def top_k_distillation_loss(
    student: Tensor,
    teacher: Tensor,
    mask: Tensor | None,
    alpha: float = 1.0,
    add_tail: bool = False,
    ratio_clip: tuple[Tensor, Tensor, float] | None = None,
) -> Tensor:
    """``[N, T]`` the per-token divergence over the teacher's top-k (module docstring), 0 where ``mask`` is 0.
    ``ratio_clip``: (current, old log-probs of the sampled tokens, c): each token's divergence times the detached
    ``min(pi / pi_old, c)`` (TRL `apply_importance_sampling_clipping`), for updates after the first."""
    if student.shape != teacher.shape:
        raise ValueError(f"student support shape {tuple(student.shape)} != teacher's {tuple(teacher.shape)}")
    teacher = teacher.detach().to(student.dtype)
    if add_tail:
        student, teacher = with_tail(student), with_tail(teacher)
    else:
        student, teacher = renormalised(student), renormalised(teacher)
    loss = generalized_jsd(student, teacher, alpha)
    if ratio_clip is not None:
        current, old, clip = ratio_clip
        log_ratio = (current.detach() - old.detach()).clamp(-20.0, 20.0)
        loss = loss * log_ratio.exp().clamp(max=clip)
    if mask is not None:  # a padded position's support is whatever the teacher said there: no gradient from it
        loss = loss.masked_fill(~mask.bool(), 0.0)
    return loss

"""Losses that weigh off-policy tokens down smoothly instead of clipping them: SAPO and VESPO.

* ``SAPO`` (token level): the clipped ratio becomes a sigmoid gate of the ratio, whose gradient weight is
  1 on-policy and decays smoothly as the ratio leaves 1.
* ``VESPO`` (sequence level): REINFORCE on each token, weighted by a Gamma-shaped function of the
  response's importance weight, which vanishes for very small and very large weights.

Both are checked against TRL 1.16's ``GRPOTrainer._compute_loss`` (``loss_type="sapo"`` / ``"vespo"``) on
random inputs in ``tests/core/test_losses_against_trl.py``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rlvr_lightning.core.losses.policy_loss_base import (
    LOG_RATIO_CLAMP,
    PolicyLoss,
    PolicyLossOutput,
    prepare_inputs,
    token_ratio,
    zero_masked,
)
from rlvr_lightning.core.masked import masked_mean, masked_sum

# VESPO's sequence weight is at least 1e-8: log w >= log(1e-8) (TRL grpo_trainer.get_gamma_weights, which matches
# the paper's code)
VESPO_LOG_MIN_WEIGHT = math.log(1e-8)


def _check_positive(loss: str, name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{loss}: {name} must be > 0, got {value}")


class SAPO(PolicyLoss):
    """SAPO: a temperature-controlled sigmoid gate of the token ratio instead of the hard clip.

    Soft Adaptive Policy Optimization (Qwen 2025, arXiv:2511.20347):
    ``l_t = -f(r_t) A`` with ``f(r) = 4/tau * sigmoid(tau (r - 1))``, ``tau = temperature_pos`` where
    ``A > 0`` else ``temperature_neg``. The gradient is ``-4 sigmoid(x)(1 - sigmoid(x)) r A grad log p`` with
    ``x = tau (r - 1)``: the on-policy gradient at ``r = 1``, smoothly smaller as ``r`` moves away (faster for
    a larger ``tau``; the paper makes negative advantages' gate the sharper one). The paper aggregates per
    sequence, ``seq-mean-token-mean``. The value on-policy is ``-2A/tau``, not ``-A``.

    As TRL 1.16 (``loss_type="sapo"``, ``importance_sampling_level="token"``) and AReaL's ``sapo_loss_fn``,
    except that the log-ratio is clamped to [-20, 20] before ``exp`` (as every ratio here), where the gate is
    flat anyway.

    Args:
        temperature_pos: the gate's temperature for tokens with a positive advantage (the paper's 1.0).
        temperature_neg: the gate's temperature for the others (the paper's 1.05).
    """

    def __init__(self, temperature_pos: float = 1.0, temperature_neg: float = 1.05) -> None:
        _check_positive("SAPO", "temperature_pos", temperature_pos)
        _check_positive("SAPO", "temperature_neg", temperature_neg)
        self.temperature_pos, self.temperature_neg = temperature_pos, temperature_neg

    def __call__(self, log_probs, old_log_probs, advantages, mask):
        old, adv, m = prepare_inputs(log_probs, old_log_probs, advantages, mask)
        ratio = token_ratio(log_probs, old)
        tau = torch.where(adv > 0, adv.new_tensor(self.temperature_pos), adv.new_tensor(self.temperature_neg))
        # f(r) = 4/tau * sigmoid(tau (r - 1)); l_t = -f(r_t) A_t  (SAPO, arXiv:2511.20347; TRL grpo_trainer "sapo")
        gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
        loss = -gate * adv
        return PolicyLossOutput(zero_masked(loss, m), ratio.detach(), m)


class VESPO(PolicyLoss):
    """VESPO: REINFORCE weighted by an asymmetric Gamma function of the sequence importance weight.

    Variational Sequence-Level Soft Policy Optimization (arXiv:2602.10693):
    ``l_t = -sg[phi(W_i)] A log pi_theta(y_t)`` with ``W_i = prod_t pi_theta(y_t) / pi_old(y_t)`` over the
    response and ``phi(W) = W^k exp(lambda (1 - W))``, which is 1 at ``W = 1`` (on-policy: REINFORCE), peaks at
    ``W = k / lambda`` and vanishes as ``W -> 0`` (rate ``k``) and ``W -> inf`` (rate ``lambda``);
    ``(k, lambda) = (k_pos, lambda_pos)`` where ``A >= 0``, else ``(k_neg, lambda_neg)`` (the paper's §3.4
    ``c1, c2``). TRL aggregates it per token (``token-mean``).

    With a token-level ``rollout_is`` correction the sampler's weights enter ``W`` rather than multiplying
    each token's loss: ``log W_i += sum_t log w_t`` (TRL ``get_gamma_weights``), so ``W`` is the ratio to
    the sampling policy; a rejected token (``w_t = 0``) counts as ``w_t = 1e-8``. A sequence mode's weight
    enters the same way (TRL refuses sequence modes with VESPO).

    As TRL 1.16 (``loss_type="vespo"``): per-token log-ratios clamped to [-20, 20], ``log W`` to
    ``[log 1e-8, 20]``, a non-finite ``phi`` is 0. TRL sums the sampler's log-weights over every position
    (1 where padded); here over the response tokens. TRL clamps ``lambda`` to at least 1e-4; here
    ``lambda <= 0`` is refused.

    Args:
        k_pos: the power of ``W`` for ``A >= 0``: how fast responses with a small weight lose their gradient.
        lambda_pos: the decay rate for ``A >= 0``: how fast responses with a large weight lose it.
        k_neg: the power of ``W`` for ``A < 0``.
        lambda_neg: the decay rate for ``A < 0``.
    """

    def __init__(self, k_pos: float = 2.0, lambda_pos: float = 3.0, k_neg: float = 3.0, lambda_neg: float = 2.0):
        for name, value in (("k_pos", k_pos), ("k_neg", k_neg)):
            if value < 0:
                raise ValueError(f"VESPO: {name} must be >= 0, got {value}")
        _check_positive("VESPO", "lambda_pos", lambda_pos)
        _check_positive("VESPO", "lambda_neg", lambda_neg)
        self.k_pos, self.lambda_pos, self.k_neg, self.lambda_neg = k_pos, lambda_pos, k_neg, lambda_neg

    def __call__(self, log_probs, old_log_probs, advantages, mask):
        return self._loss(log_probs, old_log_probs, advantages, mask, None)

    def with_rollout_is(self, log_probs, old_log_probs, advantages, mask, weights: Tensor) -> PolicyLossOutput:
        return self._loss(log_probs, old_log_probs, advantages, mask, weights)

    def _loss(self, log_probs, old_log_probs, advantages, mask, is_weights: Tensor | None) -> PolicyLossOutput:
        old, adv, m = prepare_inputs(log_probs, old_log_probs, advantages, mask)
        log_ratio = torch.clamp(log_probs.detach() - old, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        # log W_i = sum_t log(pi_theta / pi_old)  (a sum, not GSPO's mean; TRL get_gamma_weights)
        log_w = masked_sum(log_ratio, m, dim=-1).unsqueeze(-1)
        if is_weights is not None:
            # log W_i += sum_t log(pi_old / pi_sampler)  (TRL get_gamma_weights, importance_sampling_ratio)
            log_is = torch.log(is_weights.to(log_w.dtype)).clamp(VESPO_LOG_MIN_WEIGHT, LOG_RATIO_CLAMP)
            log_w = log_w + (log_is if log_is.shape[-1] == 1 else masked_sum(log_is, m, dim=-1).unsqueeze(-1))
        log_w = log_w.clamp(VESPO_LOG_MIN_WEIGHT, LOG_RATIO_CLAMP)
        nonneg = adv >= 0
        k = torch.where(nonneg, adv.new_tensor(self.k_pos), adv.new_tensor(self.k_neg))
        lam = torch.where(nonneg, adv.new_tensor(self.lambda_pos), adv.new_tensor(self.lambda_neg))
        # log phi(W) = lambda + k log W - lambda W  (VESPO §3.4; TRL get_gamma_weights)
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
        # l_t = -sg[phi(W_i)] A log pi_theta(y_t)  (TRL grpo_trainer "vespo")
        loss = -phi * adv * log_probs
        ratio = torch.exp(log_w).expand(log_probs.shape)
        extra = {"vespo_phi_mean": masked_mean(phi.expand(log_probs.shape), m)}
        return PolicyLossOutput(zero_masked(loss, m), ratio, m, extra_stats=extra)

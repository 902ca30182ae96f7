"""Clip-Cov and KL-Cov: PPO losses that restrain the few tokens whose log-prob moves most with their advantage.

Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models"
(arXiv:2505.22617), §4: the policy's entropy falls in step with the covariance between a token's log-prob and
its advantage, and a small fraction of tokens carries most of it. Per token,
``cov_t = (A_t - mean A) (log pi(y_t) - mean log pi)``, the means over the real tokens of the batch. Clip-Cov
takes the gradient off a random ``clip_cov_ratio`` fraction of the tokens whose covariance lies in
``(clip_cov_lb, clip_cov_ub)``; KL-Cov adds ``ppo_kl_coef * |log pi - log pi_old|`` to the loss of the top
``kl_cov_ratio`` fraction by covariance.

The pick is over the whole mini-batch on every data-parallel rank (``PolicyLoss.select_tokens``: the update
gathers the tokens); verl picks within each micro-batch on each rank. Called alone, without ``selected``, the
losses pick within their own inputs, as verl does.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr_lightning.core.losses.policy_loss_base import (
    PolicyLoss,
    PolicyLossOutput,
    check_clip,
    clipped_surrogate,
    prepare_inputs,
    token_ratio,
    zero_masked,
)
from rlvr_lightning.core.losses.token_selection import pick_tokens
from rlvr_lightning.core.masked import masked_mean


def token_covariance(log_probs: Tensor, advantages: Tensor) -> Tensor:
    """``[M]`` each token's centred product of advantage and log-prob (flat tokens)."""
    # cov_t = (A_t - mean(A)) * (log pi_t - mean(log pi))  (Cui et al. 2025 §4; verl 1dda039 core_algos
    # compute_policy_loss_clip_cov / _kl_cov)
    return (advantages - advantages.mean()) * (log_probs - log_probs.mean())


def _check_ratio(loss: str, name: str, value: float) -> None:
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{loss}: {name} must be in (0, 1], got {value}")


class ClipCov(PolicyLoss):
    """PPO's clipped surrogate with the gradient of a few high-covariance tokens removed (Clip-Cov).

    Among the tokens whose covariance lies in ``(clip_cov_lb, clip_cov_ub)`` and on which PPO's clip is not
    already binding, ``max(int(clip_cov_ratio * M), 1)`` chosen at random (``M`` the real tokens picked over)
    get loss 0, so no gradient (verl multiplies their loss by 0, as here; the paper detaches them).

    Args:
        clip_low: the ratio's lower clip is ``1 - clip_low``.
        clip_high: the ratio's upper clip is ``1 + clip_high`` (None: ``clip_low``).
        clip_cov_ratio: the fraction of tokens taken off the gradient (verl and the paper: 2e-4).
        clip_cov_lb: the covariance band's lower end (1.0).
        clip_cov_ub: the covariance band's upper end (5.0).
    """

    selects_tokens = True

    def __init__(
        self,
        clip_low: float = 0.2,
        clip_high: float | None = None,
        clip_cov_ratio: float = 2e-4,
        clip_cov_lb: float = 1.0,
        clip_cov_ub: float = 5.0,
    ) -> None:
        clip_high = clip_low if clip_high is None else clip_high
        check_clip("ClipCov", "clip_low", clip_low)
        check_clip("ClipCov", "clip_high", clip_high)
        _check_ratio("ClipCov", "clip_cov_ratio", clip_cov_ratio)
        if not clip_cov_lb < clip_cov_ub:
            raise ValueError(f"ClipCov: need clip_cov_lb < clip_cov_ub, got {clip_cov_lb} and {clip_cov_ub}")
        self.clip_low, self.clip_high, self.clip_cov_ratio = clip_low, clip_high, clip_cov_ratio
        self.clip_cov_lb, self.clip_cov_ub = clip_cov_lb, clip_cov_ub

    def select_tokens(self, log_probs, old_log_probs, advantages, entropy, generator):
        ratio = token_ratio(log_probs, old_log_probs)
        surrogate = -advantages * ratio
        clipped = -advantages * torch.clamp(ratio, 1.0 - self.clip_low, 1.0 + self.clip_high)
        cov = token_covariance(log_probs, advantages)
        # candidates: cov in (lb, ub) where the clip does not bind  (verl compute_policy_loss_clip_cov clip_by_origin)
        candidates = torch.nonzero((cov > self.clip_cov_lb) & (cov < self.clip_cov_ub) & ~(clipped > surrogate))
        count = max(int(self.clip_cov_ratio * log_probs.numel()), 1)
        order = torch.randperm(len(candidates), generator=generator, device=candidates.device)
        picked = torch.zeros_like(log_probs, dtype=torch.bool)
        picked[candidates[order[:count], 0]] = True
        return picked

    def __call__(self, log_probs, old_log_probs, advantages, mask, selected: Tensor | None = None):
        old, adv, m = prepare_inputs(log_probs, old_log_probs, advantages, mask)
        if selected is None:
            selected = pick_tokens(self, log_probs, old, advantages, m)
        loss, ratio_value, low, high = clipped_surrogate(
            token_ratio(log_probs, old), adv, self.clip_low, self.clip_high
        )
        # l_t = 0 on the picked tokens: no gradient  (Cui et al. 2025 §4.2 eq. 11, Clip-Cov)
        loss = torch.where(selected, torch.zeros((), dtype=loss.dtype, device=loss.device), loss)
        extra = {"cov_selected_frac": masked_mean(selected.to(ratio_value.dtype), m)}
        return PolicyLossOutput(zero_masked(loss, m), ratio_value, m, low, high, extra)


class KLCov(PolicyLoss):
    """The unclipped importance-weighted surrogate plus a KL penalty on the top tokens by covariance (KL-Cov).

    ``l_t = -A_t r_t`` on every token, plus ``ppo_kl_coef * |log pi - log pi_old|`` on the
    ``max(int(kl_cov_ratio * M), 1)`` tokens of largest covariance (no clip, as in the paper and verl).

    Args:
        kl_cov_ratio: the fraction of tokens penalised (verl: 2e-4; the paper 2e-3 for Qwen2.5-7B).
        ppo_kl_coef: the penalty's weight (1.0).
    """

    selects_tokens = True

    def __init__(self, kl_cov_ratio: float = 2e-4, ppo_kl_coef: float = 1.0) -> None:
        _check_ratio("KLCov", "kl_cov_ratio", kl_cov_ratio)
        if ppo_kl_coef < 0:
            raise ValueError(f"KLCov: ppo_kl_coef must be >= 0, got {ppo_kl_coef}")
        self.kl_cov_ratio, self.ppo_kl_coef = kl_cov_ratio, ppo_kl_coef

    def select_tokens(self, log_probs, old_log_probs, advantages, entropy, generator):
        picked = torch.zeros_like(log_probs, dtype=torch.bool)
        if log_probs.numel() == 0:
            return picked
        count = max(1, int(log_probs.numel() * self.kl_cov_ratio))
        # the top-k tokens by covariance  (verl compute_policy_loss_kl_cov: torch.topk(cov_lst_all, k_percent_nums))
        picked[torch.topk(token_covariance(log_probs, advantages), count, largest=True).indices] = True
        return picked

    def __call__(self, log_probs, old_log_probs, advantages, mask, selected: Tensor | None = None):
        old, adv, m = prepare_inputs(log_probs, old_log_probs, advantages, mask)
        if selected is None:
            selected = pick_tokens(self, log_probs, old, advantages, m)
        ratio = token_ratio(log_probs, old)
        # l_t = -A_t r_t + k |log pi - log pi_old| on the picked tokens  (Cui et al. 2025 §4.2 eq. 12, KL-Cov)
        penalty = self.ppo_kl_coef * (log_probs - old).abs()
        loss = -adv * ratio + torch.where(
            selected, penalty, torch.zeros((), dtype=penalty.dtype, device=penalty.device)
        )
        extra = {"cov_selected_frac": masked_mean(selected.to(ratio.dtype), m)}
        return PolicyLossOutput(zero_masked(loss, m), ratio.detach(), m, extra_stats=extra)

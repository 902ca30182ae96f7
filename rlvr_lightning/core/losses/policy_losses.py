"""The built-in per-token policy losses and the shorthands a config may name them by.

The contract every loss keeps (inputs, the unaggregated ``[N, T]`` loss, statistics) is
``core/losses/policy_loss_base.py``; the sequence-level ratio losses (``GSPO``, ``LUSPO``, ``GMPO``, and ``TOPR``,
whose weight is the trajectory's ratio) are in ``core/losses/sequence_losses.py``, the losses that weigh instead
of clipping (``SAPO``, ``VESPO``) in ``core/losses/soft_losses.py``, DPPO's divergence trust region in
``core/losses/divergence_losses.py``, the losses that pick tokens over the mini-batch (``ClipCov``, ``KLCov``,
``HighEntropyTokens``) in ``core/losses/covariance_losses.py`` and ``core/losses/token_selection.py``.
Every built-in loss can be imported from here.
"""

from __future__ import annotations

import torch

from rlvr_lightning.core.losses.covariance_losses import ClipCov, KLCov
from rlvr_lightning.core.losses.divergence_losses import DPPO
from rlvr_lightning.core.losses.policy_loss_base import (
    PolicyLoss,
    PolicyLossOutput,
    check_clip,
    clipped_surrogate,
    merged_stats,
    prepare_inputs,
    token_ratio,
    zero_masked,
)
from rlvr_lightning.core.losses.sequence_losses import GMPO, GSPO, LUSPO, TOPR
from rlvr_lightning.core.losses.soft_losses import SAPO, VESPO
from rlvr_lightning.core.losses.token_selection import HighEntropyTokens
from rlvr_lightning.core.masked import masked_mean
from rlvr_lightning.core.shorthands import from_shorthand

__all__ = [
    "CISPO",
    "DPPO",
    "GMPO",
    "GSPO",
    "KLCov",
    "ClipCov",
    "HighEntropyTokens",
    "LUSPO",
    "POLICY_LOSSES",
    "SAPO",
    "TOPR",
    "VESPO",
    "ImportanceRatio",
    "PPOClip",
    "PolicyGradient",
    "PolicyLoss",
    "PolicyLossOutput",
    "merged_stats",
    "policy_loss",
]


class PolicyGradient(PolicyLoss):
    """REINFORCE: ``-A * log p``. ``old_log_probs`` is ignored (strictly on-policy)."""

    needs_old_log_probs = False

    def __call__(self, log_probs, old_log_probs, advantages, mask):
        _, adv, m = prepare_inputs(log_probs, old_log_probs, advantages, mask)
        # l_t = -A * log pi_theta(y_t)  (Williams 1992, REINFORCE)
        loss = -adv * log_probs
        return PolicyLossOutput(zero_masked(loss, m), torch.ones_like(log_probs), m)


class ImportanceRatio(PolicyLoss):
    """Unclipped importance-weighted surrogate: ``-A * exp(logp - old_logp)``."""

    def __call__(self, log_probs, old_log_probs, advantages, mask):
        old, adv, m = prepare_inputs(log_probs, old_log_probs, advantages, mask)
        ratio = token_ratio(log_probs, old)
        # l_t = -A * r_t  (Schulman et al. 2017 PPO eq. 6, L^CPI, no clipping)
        loss = -adv * ratio
        return PolicyLossOutput(zero_masked(loss, m), ratio.detach(), m)


class PPOClip(PolicyLoss):
    """Clipped surrogate with separate lower/upper ranges and an optional dual clip.

    Args:
        clip_low: the ratio's lower clip is ``1 - clip_low``.
        clip_high: the ratio's upper clip is ``1 + clip_high`` (None: ``clip_low``); above ``clip_low`` it is
            DAPO's clip-higher.
        dual_clip: a constant ``c > 1`` bounding the loss of negative-advantage tokens with a huge ratio at
            ``-A * c`` (None: no dual clip). With ``c > 1 + clip_high`` it is TRL's ``delta`` (INTELLECT-2's
            two-sided clipping; ``tests/core/test_losses_against_trl.py``).
    """

    def __init__(self, clip_low: float = 0.2, clip_high: float | None = None, dual_clip: float | None = None) -> None:
        clip_high = clip_low if clip_high is None else clip_high
        check_clip("PPOClip", "clip_low", clip_low)
        check_clip("PPOClip", "clip_high", clip_high)
        if dual_clip is not None and dual_clip <= 1.0:
            raise ValueError(f"PPOClip: dual_clip must be > 1 (or None), got {dual_clip}")
        self.clip_low, self.clip_high, self.dual_clip = clip_low, clip_high, dual_clip

    def __call__(self, log_probs, old_log_probs, advantages, mask):
        clip_low, clip_high, dual_clip = self.clip_low, self.clip_high, self.dual_clip
        old, adv, m = prepare_inputs(log_probs, old_log_probs, advantages, mask)
        ratio = token_ratio(log_probs, old)
        # asymmetric eps = DAPO clip-higher, Yu et al. 2025 §3.1
        loss, ratio_value, low_clipped, high_clipped = clipped_surrogate(ratio, adv, clip_low, clip_high)
        extra = {}
        if dual_clip is not None:
            # A < 0: l_t = min(l_t, -A c)  (dual-clip PPO, Ye et al. 2020 "Mastering Complex Control in MOBA Games";
            # verl core_algos.compute_policy_loss clip_ratio_c)
            loss = torch.where(adv < 0, torch.minimum(loss, -adv * dual_clip), loss)
            extra["dual_clip_frac"] = masked_mean(((adv < 0) & (ratio_value > dual_clip)).to(ratio.dtype), m)
        return PolicyLossOutput(zero_masked(loss, m), ratio_value, m, low_clipped, high_clipped, extra)


class CISPO(PolicyLoss):
    """CISPO: REINFORCE weighted by a clipped, stop-gradient importance weight.

    ``loss = -sg(clip(r, 1 - clip_low, 1 + clip_high)) * A * logp``. No token is
    ever dropped from the gradient; only its weight is bounded. Clip fractions count
    clipped WEIGHTS, regardless of the sign of A.

    Args:
        clip_low: the weight's lower bound is ``1 - clip_low``; None (default): no lower bound, as in
            MiniMax-M1 ("we did not impose a lower bound on the IS weight").
        clip_high: the weight's upper bound is ``1 + clip_high``.
    """

    def __init__(self, clip_low: float | None = None, clip_high: float = 0.2) -> None:
        if clip_low is not None:
            check_clip("CISPO", "clip_low", clip_low)
        check_clip("CISPO", "clip_high", clip_high)
        self.clip_low, self.clip_high = clip_low, clip_high

    def __call__(self, log_probs, old_log_probs, advantages, mask):
        old, adv, m = prepare_inputs(log_probs, old_log_probs, advantages, mask)
        ratio = token_ratio(log_probs, old).detach()
        lower = None if self.clip_low is None else 1.0 - self.clip_low
        weight = torch.clamp(ratio, min=lower, max=1.0 + self.clip_high)
        # l_t = -sg(clip(r_t, 1-eps_low^IS, 1+eps_high^IS)) * A * log pi_theta(y_t)  (MiniMax-M1 2025, §3.1 eq. 4)
        loss = -weight * adv * log_probs
        low_clipped = None if lower is None else ratio < lower
        high_clipped = ratio > 1.0 + self.clip_high
        return PolicyLossOutput(zero_masked(loss, m), ratio, m, low_clipped, high_clipped)


# ----------------------------------------------------------------------------- shorthands

#: the names a config may give instead of a class: each stands for its class with its defaults
POLICY_LOSSES: dict[str, type[PolicyLoss]] = {
    "pg": PolicyGradient,
    "ratio": ImportanceRatio,
    "ppo_clip": PPOClip,
    "gspo": GSPO,
    "cispo": CISPO,
    "sapo": SAPO,
    "luspo": LUSPO,
    "vespo": VESPO,
    "gmpo": GMPO,
    "dppo": DPPO,
    "clip_cov": ClipCov,
    "kl_cov": KLCov,
    "high_entropy": HighEntropyTokens,
    "topr": TOPR,
}


def policy_loss(value: PolicyLoss | str, option: str = "loss") -> PolicyLoss:
    """``value`` itself, or the built-in loss a shorthand names (with its defaults)."""
    example = "rlvr_lightning.core.PPOClip, or a class of your own"
    return from_shorthand(value, PolicyLoss, POLICY_LOSSES, option, example)

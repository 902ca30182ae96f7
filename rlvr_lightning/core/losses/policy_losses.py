"""The built-in per-token policy losses and the shorthands a config may name them by.

The contract every loss keeps (inputs, the unaggregated ``[N, T]`` loss, statistics) is
``core/losses/policy_loss_base.py``. Here: ``PolicyGradient``, ``ImportanceRatio``, ``PPOClip``, ``GPPO`` (PPO's
clip with a gradient on the clipped tokens) and ``CISPO``. The sequence-level ratio losses (``GSPO``, ``LUSPO``,
``GMPO``, and ``TOPR``, whose weight is the trajectory's ratio) are in ``core/losses/sequence_losses.py``, the
losses that weigh instead of clipping (``SAPO``, ``VESPO``) in ``core/losses/soft_losses.py``, DPPO's divergence
trust region in ``core/losses/divergence_losses.py``, the entropy-shaped advantages (``EntropyShapedAdvantage``) in
``core/losses/entropy_shaping.py``, the losses that pick tokens over the mini-batch
(``ClipCov``, ``KLCov``, ``HighEntropyTokens``) in ``core/losses/covariance_losses.py`` and
``core/losses/token_selection.py``, Archer's clip by each token's entropy (``Archer``, and ``ASPO``'s flipped
weight on positive tokens) in ``core/losses/entropy_clip.py``, A*-PO's regression onto the optimal advantage
(``AStarPO``) in ``core/losses/regression_losses.py``.
Every built-in loss can be imported from here.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr_lightning.core.losses.balanced_clip import BAPO
from rlvr_lightning.core.losses.covariance_losses import ClipCov, KLCov
from rlvr_lightning.core.losses.divergence_losses import DPPO
from rlvr_lightning.core.losses.entropy_clip import ASPO, Archer
from rlvr_lightning.core.losses.entropy_shaping import EntropyShapedAdvantage
from rlvr_lightning.core.losses.flow_balance import FlowRL
from rlvr_lightning.core.losses.group_variance import GVPO
from rlvr_lightning.core.losses.off_policy_guidance import LUFFY
from rlvr_lightning.core.losses.policy_loss_base import (
    PolicyLoss,
    PolicyLossOutput,
    bounded_surrogate,
    check_clip,
    check_dual_clip,
    clipped_surrogate,
    dual_clipped,
    merged_stats,
    prepare_inputs,
    token_ratio,
    zero_masked,
)
from rlvr_lightning.core.losses.regression_losses import AStarPO
from rlvr_lightning.core.losses.second_moment import M2PO
from rlvr_lightning.core.losses.sequence_losses import GMPO, GSPO, LUSPO, TOPR
from rlvr_lightning.core.losses.soft_losses import SAPO, VESPO
from rlvr_lightning.core.losses.token_selection import HighEntropyTokens
from rlvr_lightning.core.losses.top_k_boost import SimKO
from rlvr_lightning.core.shorthands import from_shorthand

__all__ = [
    "ASPO",
    "AStarPO",
    "Archer",
    "BAPO",
    "CISPO",
    "DPPO",
    "DynamicClip",
    "EntropyShapedAdvantage",
    "FlowRL",
    "GMPO",
    "GPPO",
    "GSPO",
    "GVPO",
    "KLCov",
    "ClipCov",
    "HighEntropyTokens",
    "LUFFY",
    "LUSPO",
    "M2PO",
    "POLICY_LOSSES",
    "SAPO",
    "SimKO",
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
        check_dual_clip("PPOClip", dual_clip)
        self.clip_low, self.clip_high, self.dual_clip = clip_low, clip_high, dual_clip

    def __call__(self, log_probs, old_log_probs, advantages, mask):
        old, adv, m = prepare_inputs(log_probs, old_log_probs, advantages, mask)
        ratio = token_ratio(log_probs, old)
        loss, ratio_value, low_clipped, high_clipped = self.surrogate(log_probs, old, ratio, adv)
        loss, extra = dual_clipped(loss, adv, ratio_value, self.dual_clip, m)
        return PolicyLossOutput(zero_masked(loss, m), ratio_value, m, low_clipped, high_clipped, extra)

    def surrogate(
        self, log_probs: Tensor, old_log_probs: Tensor, ratio: Tensor, adv: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The per-token loss before the dual clip, the detached ratio and where the lower and upper clips act."""
        # asymmetric eps = DAPO clip-higher, Yu et al. 2025 §3.1
        return clipped_surrogate(ratio, adv, self.clip_low, self.clip_high)


class GPPO(PPOClip):
    """GPPO: PPO's clipped surrogate whose clipped tokens keep a bounded gradient (Su et al. 2025, Klear-Reasoner,
    arXiv:2508.07629).

    Where PPO's clip binds (``r < 1 - clip_low`` with ``A < 0``, ``r > 1 + clip_high`` with ``A > 0``) its loss is a
    constant and the token gets no gradient. GPPO keeps the value and lets the gradient through, scaled to the bound:
    ``l_t = -beta (1 -/+ eps) A r_t / sg(r_t)``, whose gradient is ``-beta (1 -/+ eps) A grad log pi``. Elsewhere,
    and with the dual clip, it is :class:`PPOClip`. ``beta_low`` and ``beta_high`` (1: GPPO) weigh the two
    sides' gradients (CE-GPPO, arXiv:2509.20712; the Klear code's ``gppo_general`` defaults to 0.25 and 1).
    Values and gradients equal the Klear code's ``compute_gppo_loss`` and ``compute_gppo_loss_general_beta``
    (``tests/core/test_gppo.py``), except that the log-ratio is clamped to ``[-20, 20]`` first.

    Args:
        clip_low: the ratio's lower clip is ``1 - clip_low`` (as :class:`PPOClip`).
        clip_high: the ratio's upper clip is ``1 + clip_high`` (None: ``clip_low``).
        dual_clip: as :class:`PPOClip`'s (None: none).
        beta_low: the gradient's weight on the tokens the lower clip binds.
        beta_high: the gradient's weight on the tokens the upper clip binds.
    """

    def __init__(
        self,
        clip_low: float = 0.2,
        clip_high: float | None = None,
        dual_clip: float | None = None,
        beta_low: float = 1.0,
        beta_high: float = 1.0,
    ) -> None:
        super().__init__(clip_low, clip_high, dual_clip)
        check_clip("GPPO", "beta_low", beta_low)
        check_clip("GPPO", "beta_high", beta_high)
        self.beta_low, self.beta_high = beta_low, beta_high

    def surrogate(
        self, log_probs: Tensor, old_log_probs: Tensor, ratio: Tensor, adv: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        _, ratio_value, low_clipped, high_clipped = clipped_surrogate(ratio, adv, self.clip_low, self.clip_high)
        unit = torch.exp(log_probs - log_probs.detach())  # 1 in value, grad log pi in gradient
        # l_t = -beta_low (1 - eps_low) A r/sg(r) if bound below, -beta_high (1 + eps_high) A r/sg(r) if bound above,
        # else -A r  (Su et al. 2025 GPPO; Klear compute_gppo_loss_general_beta)
        low = -self.beta_low * (1.0 - self.clip_low) * adv * unit
        high = -self.beta_high * (1.0 + self.clip_high) * adv * unit
        loss = torch.where(low_clipped, low, torch.where(high_clipped, high, -adv * ratio))
        return loss, ratio_value, low_clipped, high_clipped


class DynamicClip(PPOClip):
    """DCPO's dynamic-adaptive clipping (Yang et al. 2025, arXiv:2509.02333): PPO's clipped surrogate whose
    bounds on the ratio depend on each token's probability ``q`` under the policy that sampled it, from
    ``|(r - 1) r q| <= eps``: ``0.5 + 0.5 sqrt(max(1 - 4 eps_low / q, 0)) <= r <= 0.5 + 0.5 sqrt(1 + 4 eps_high / q)``,
    the upper bound at most ``max_ratio``. A rare token may rise far more than ``1 + eps_high`` (q = 0.01,
    eps_high = 0.28: up to 5.8x) and a likely one less; the lower bound is never below 0.5. As the authors'
    ``get_clip_low_high`` and ``compute_policy_loss_dcpo`` (``clip_type: dynamic``), whose run uses eps 0.2 / 0.28
    and ``clip_ratio_c`` 10 (the dual clip; the upper bound's cap is 10 whatever it is):
    ``tests/core/test_dynamic_clip.py``.

    Args:
        clip_low: eps_low.
        clip_high: eps_high (None: ``clip_low``).
        max_ratio: the largest upper bound (the authors' 10).
        dual_clip: as :class:`PPOClip`'s (the authors' 10; None: none).
    """

    def __init__(
        self,
        clip_low: float = 0.2,
        clip_high: float | None = 0.28,
        max_ratio: float = 10.0,
        dual_clip: float | None = 10.0,
    ) -> None:
        super().__init__(clip_low, clip_high, dual_clip)
        if max_ratio <= 1.0:
            raise ValueError(f"DynamicClip: max_ratio must be > 1, got {max_ratio}")
        self.max_ratio = max_ratio

    def bounds(self, old_log_probs: Tensor) -> tuple[Tensor, Tensor]:
        """The ratio's lower and upper bound for tokens of these old log-probs."""
        q = old_log_probs.exp()
        # r in [1/2 + 1/2 sqrt(max(1 - 4 eps_low / q, 0)), 1/2 + 1/2 sqrt(1 + 4 eps_high / q)]
        # (DCPO, arXiv:2509.02333, dynamic-adaptive clipping; the authors' get_clip_low_high)
        lower = 0.5 + 0.5 * torch.sqrt(torch.clamp(1.0 - 4.0 * self.clip_low / q, min=0.0))
        upper = 0.5 + 0.5 * torch.sqrt(1.0 + 4.0 * self.clip_high / q)
        return lower, torch.clamp(upper, max=self.max_ratio)

    def surrogate(
        self, log_probs: Tensor, old_log_probs: Tensor, ratio: Tensor, adv: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return bounded_surrogate(ratio, adv, *self.bounds(old_log_probs))


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
    "gppo": GPPO,
    "entropy_shaped": EntropyShapedAdvantage,
    "astar_po": AStarPO,
    "luffy": LUFFY,
    "m2po": M2PO,
    "dynamic_clip": DynamicClip,
    "bapo": BAPO,
    "gvpo": GVPO,
    "archer": Archer,
    "aspo": ASPO,
    "flowrl": FlowRL,
    "simko": SimKO,
}


def policy_loss(value: PolicyLoss | str, option: str = "loss") -> PolicyLoss:
    """``value`` itself, or the built-in loss a shorthand names (with its defaults)."""
    example = "rlvr_lightning.core.PPOClip, or a class of your own"
    return from_shorthand(value, PolicyLoss, POLICY_LOSSES, option, example)

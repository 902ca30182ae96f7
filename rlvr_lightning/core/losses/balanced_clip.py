"""`BAPO`: PPO's clipped surrogate whose bounds are searched for each mini-batch, so that the positive-advantage
tokens carry a set share of the loss.

Xi et al. 2025, "BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs via Balanced Policy Optimization with
Adaptive Clipping" (arXiv:2510.18927, eq. 8 and Algorithm 1). With a fixed clip the negative-advantage tokens come
to dominate an off-policy update, and the upper bound keeps out the low-probability positive tokens that would
raise the entropy. Before each update BAPO starts from ``c_low = a-`` and ``c_high = a+`` and raises the bounds by
steps until the positive tokens' share of the surrogate's magnitude,

    rho = sum_{A > 0} |w_t A_t min(r_t, c_high)| / (that + sum_{A < 0} |w_t A_t max(r_t, c_low)|),

reaches ``rho_0`` (``w_t = pi_rollout(y_t)``, the token's probability when sampled, in eq. 8; 1 in the authors'
code): ``c_high`` first, up to ``b+``, then ``c_low`` up to ``b-`` (Algorithm 1; the authors' verl recipe raises
``c_low`` first). A step never passes a range's end. Raising ``c_low`` adds to the clipped negative tokens' values,
so once ``c_high`` alone cannot reach ``rho_0`` the search ends with ``c_low`` at ``b-``: the negative tokens with
``r < b-`` then keep no gradient.

The search runs on the real tokens of the whole mini-batch, on every data-parallel rank (`select_tokens`, as the
losses that pick tokens); each token's bound reaches the loss as ``selected``: ``c_high`` for ``A >= 0``, ``c_low``
for ``A < 0``, which is all PPO's clip reads of a token.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr_lightning.core.losses.policy_loss_base import (
    PolicyLoss,
    PolicyLossOutput,
    bounded_surrogate,
    check_choice,
    check_dual_clip,
    dual_clipped,
    prepare_inputs,
    token_ratio,
    zero_masked,
)
from rlvr_lightning.core.losses.token_selection import pick_tokens

RAISE_FIRST = ("upper", "lower")


def signed_contributions(
    ratio: Tensor, advantages: Tensor, weight: Tensor, low: float | Tensor, high: float | Tensor
) -> Tensor:
    """Each token's surrogate ``w A min(r, c_high)`` (``A >= 0``) or ``w A max(r, c_low)`` (``A < 0``), float64; the
    bounds numbers or per-token tensors."""
    ratio, advantages, weight = ratio.double(), advantages.double(), weight.double()
    clipped = torch.where(advantages >= 0, torch.clamp(ratio, max=high), torch.clamp(ratio, min=low))
    # min(r A, clip(r, c_low, c_high) A), weighted by pi_rollout(y_t)  (BAPO, arXiv:2510.18927 eq. 8)
    return weight * advantages * clipped


def positive_share(ratio: Tensor, advantages: Tensor, weight: Tensor, low: float, high: float) -> float:
    """rho: the positive tokens' share of the surrogate's total magnitude (1 when there is none)."""
    values = signed_contributions(ratio, advantages, weight, low, high)
    positive, negative = values.clamp(min=0).sum(), -values.clamp(max=0).sum()
    total = float(positive + negative)
    return 1.0 if total <= 0.0 else float(positive) / total


def balanced_bounds(
    ratio: Tensor,
    advantages: Tensor,
    weight: Tensor,
    target: float,
    lower: tuple[float, float],
    upper: tuple[float, float],
    lower_step: float,
    upper_step: float,
    raise_first: str = "upper",
) -> tuple[float, float, float]:
    """``(c_low, c_high, rho)`` for flat ``[M]`` tokens: each bound raised by its step, in the order ``raise_first``
    says, while rho is below ``target`` (BAPO Algorithm 1; the authors' ``compute_policy_loss_bapo``)."""
    bounds = {"lower": lower[0], "upper": upper[0]}
    ends = {"lower": (lower[1], lower_step), "upper": (upper[1], upper_step)}
    share = positive_share(ratio, advantages, weight, bounds["lower"], bounds["upper"])
    for side in (raise_first, *(s for s in RAISE_FIRST if s != raise_first)):
        end, step = ends[side]
        while share < target and bounds[side] < end and step > 0:
            bounds[side] = min(bounds[side] + step, end)
            share = positive_share(ratio, advantages, weight, bounds["lower"], bounds["upper"])
    return bounds["lower"], bounds["upper"], share


class BAPO(PolicyLoss):
    """PPO's clip with bounds searched for each mini-batch until the positive tokens carry ``target`` of the loss
    (Xi et al. 2025, arXiv:2510.18927; see the module docstring). Logged: ``bapo_clip_low``, ``bapo_clip_high``
    (the bounds, averaged over the step's mini-batches) and ``bapo_positive_share`` (rho at those bounds).

    Args:
        target: rho_0, the positive tokens' share to reach (the paper's 0.4; the authors' script 0.5).
        lower: ``[a-, b-]``, the range of the lower bound on the ratio (the paper's [0.6, 0.9]).
        upper: ``[a+, b+]``, the range of the upper bound (the paper's [1.2, 3.0]).
        lower_step: delta_2, the lower bound's step (0.02).
        upper_step: delta_1, the upper bound's step (0.05).
        raise_first: ``upper`` (Algorithm 1) or ``lower`` (the authors' verl recipe).
        probability_weighted: weigh each token by its probability when sampled in rho (eq. 8); False: the authors'
            code.
        dual_clip: as ``PPOClip``'s (None, the paper's; the authors' verl recipe applies verl's 3).
    """

    selects_tokens = True

    def __init__(
        self,
        target: float = 0.4,
        lower: tuple[float, float] = (0.6, 0.9),
        upper: tuple[float, float] = (1.2, 3.0),
        lower_step: float = 0.02,
        upper_step: float = 0.05,
        raise_first: str = "upper",
        probability_weighted: bool = True,
        dual_clip: float | None = None,
    ) -> None:
        lower, upper = tuple(float(v) for v in lower), tuple(float(v) for v in upper)
        if len(lower) != 2 or len(upper) != 2 or not 0.0 < lower[0] <= lower[1] <= 1.0 <= upper[0] <= upper[1]:
            raise ValueError(
                f"BAPO: the bounds' ranges must satisfy 0 < lower[0] <= lower[1] <= 1 <= upper[0] <= upper[1], got "
                f"lower={list(lower)}, upper={list(upper)}"
            )
        if not 0.0 <= target <= 1.0:
            raise ValueError(f"BAPO: target must be in [0, 1], got {target}")
        if lower_step < 0 or upper_step < 0:
            raise ValueError(f"BAPO: steps must be >= 0, got lower_step={lower_step}, upper_step={upper_step}")
        check_choice("BAPO", "raise_first", raise_first, RAISE_FIRST)
        check_dual_clip("BAPO", dual_clip)
        self.target, self.lower, self.upper = target, lower, upper
        self.lower_step, self.upper_step = lower_step, upper_step
        self.raise_first, self.probability_weighted, self.dual_clip = raise_first, probability_weighted, dual_clip

    def weight(self, old_log_probs: Tensor) -> Tensor:
        """Each token's weight in rho: its probability when sampled (eq. 8), or 1."""
        return old_log_probs.exp() if self.probability_weighted else torch.ones_like(old_log_probs)

    def bounds(self, log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor) -> tuple[float, float, float]:
        """``(c_low, c_high, rho)`` for flat ``[M]`` tokens."""
        return balanced_bounds(
            token_ratio(log_probs, old_log_probs),
            advantages,
            self.weight(old_log_probs),
            self.target,
            self.lower,
            self.upper,
            self.lower_step,
            self.upper_step,
            self.raise_first,
        )

    def select_tokens(self, log_probs, old_log_probs, advantages, entropy, generator) -> Tensor:
        """float ``[M]``: each token's bound on its ratio, ``c_high`` where ``A >= 0``, ``c_low`` where ``A < 0``."""
        low, high, _ = self.bounds(log_probs, old_log_probs, advantages)
        return torch.where(advantages >= 0, high, low).to(log_probs.dtype)

    def __call__(self, log_probs, old_log_probs, advantages, mask, selected: Tensor | None = None):
        """``selected``: each token's bound from the search over the mini-batch; None: searched on these tokens."""
        if selected is None:
            selected = pick_tokens(self, log_probs, old_log_probs, advantages, mask)
        old, adv, m = prepare_inputs(log_probs, old_log_probs, advantages, mask)
        ratio = token_ratio(log_probs, old)
        bound = selected.to(ratio.dtype)
        # PPO's clip with bounds [c_low, c_high]: a token's loss reads c_high if A >= 0, c_low if A < 0
        loss, ratio_value, low_clipped, high_clipped = bounded_surrogate(ratio, adv, bound, bound)
        loss, extra = dual_clipped(loss, adv, ratio_value, self.dual_clip, m)
        out = PolicyLossOutput(zero_masked(loss, m), ratio_value, m, low_clipped, high_clipped, extra)
        self._bound_stats(out, old, adv.expand_as(ratio), bound, m)
        return out

    @torch.no_grad()
    def _bound_stats(self, out: PolicyLossOutput, old: Tensor, adv: Tensor, bound: Tensor, m: Tensor | None) -> None:
        real = torch.ones_like(bound, dtype=torch.bool) if m is None else m
        for name, side in (("bapo_clip_low", real & (adv < 0)), ("bapo_clip_high", real & (adv >= 0))):
            count = side.sum().to(bound.dtype)
            out.extra_stats[name] = torch.where(side, bound, 0.0).sum() / count.clamp(min=1.0)
            out.extra_weights[name] = count
        values = torch.where(real, signed_contributions(out.ratio, adv, self.weight(old), bound, bound), 0.0)
        positive, total = values.clamp(min=0).sum(), values.abs().sum()
        out.extra_stats["bapo_positive_share"] = (positive / total.clamp(min=1e-30)).to(bound.dtype)
        out.extra_weights["bapo_positive_share"] = total.to(bound.dtype)

"""DPPO: a trust region on how far each token's probability moved, instead of PPO's bound on its ratio.

Divergence Proximal Policy Optimization (Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement
Learning", arXiv:2602.04879). PPO's clip bounds ``r = pi / pi_old``: a rare token's ratio swings widely while
its probability barely moves (it is clipped for nothing), and a likely token can move far within the ratio
bound. DPPO bounds the divergence between the two-outcome distributions "this token / any other" under
``pi_old`` and ``pi`` instead, the Binary-TV ``|p - p_old|`` or the Binary-KL
``p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p))``. verl implements both
(``compute_policy_loss_dppo_tv``, ``compute_policy_loss_dppo_kl``); the paper's top-K approximation needs the
full distributions and is left out here, as there.
"""

from __future__ import annotations

import torch

from rlvr_lightning.core.losses.policy_loss_base import (
    LOG_RATIO_CLAMP,
    PolicyLoss,
    PolicyLossOutput,
    check_choice,
    check_clip,
    prepare_inputs,
    zero_masked,
)

#: ``divergence``: the binary total variation or the binary KL, each with the threshold verl's example uses
DIVERGENCE_THRESHOLDS = {"tv": 0.15, "kl": 0.05}


class DPPO(PolicyLoss):
    """DPPO-Binary-TV / -KL: the importance-weighted policy gradient, without the tokens that left the trust region.

    ``l_t = -A_t sg[min(r_t, max_ratio)] log pi(y_t)``, except that a token whose probability moved past the
    threshold in the direction its advantage pushes gets no gradient (loss 0; it still counts in the
    aggregation's divisor): with A > 0, a token whose probability rose by more than ``clip_high`` (TV:
    ``p - p_old > clip_high``; KL: a divergence above ``clip_high`` with ``p > p_old``); with A <= 0, one whose
    probability fell by more than ``clip_low``. A token moving against its advantage always keeps its gradient,
    as under PPO's clip. The ratio is truncated at ``max_ratio`` instead of PPO's dual clip (the paper's §5.4
    recommends a large value). Values and gradients equal verl's (``tests/core/test_dppo.py``); the clip
    fractions count the masked tokens by the sign of their advantage.

    Args:
        divergence: ``tv`` (DPPO-Binary-TV) or ``kl`` (DPPO-Binary-KL).
        clip_low: the divergence allowed when the advantage is <= 0 (None: 0.15 for tv, 0.05 for kl).
        clip_high: the divergence allowed when the advantage is > 0 (None: as ``clip_low``'s default).
        max_ratio: the importance weight's truncation.
    """

    def __init__(
        self,
        divergence: str = "tv",
        clip_low: float | None = None,
        clip_high: float | None = None,
        max_ratio: float = 20.0,
    ) -> None:
        check_choice("DPPO", "divergence", divergence, DIVERGENCE_THRESHOLDS)
        default = DIVERGENCE_THRESHOLDS[divergence]
        clip_low = default if clip_low is None else clip_low
        clip_high = default if clip_high is None else clip_high
        check_clip("DPPO", "clip_low", clip_low)
        check_clip("DPPO", "clip_high", clip_high)
        if max_ratio <= 0:
            raise ValueError(f"DPPO: max_ratio must be > 0, got {max_ratio}")
        self.divergence, self.clip_low, self.clip_high, self.max_ratio = divergence, clip_low, clip_high, max_ratio

    def _kept(self, log_probs, old, adv):
        """bool [N, T]: the tokens inside the trust region on the side their advantage pushes."""
        prob, old_prob = torch.exp(log_probs), torch.exp(old)
        if self.divergence == "tv":
            # |p - p_old| bounded on the advantage's side  (Qi et al. 2026 DPPO-Binary-TV; verl dppo_tv)
            rose_within, fell_within = prob - old_prob <= self.clip_high, prob - old_prob >= -self.clip_low
        else:
            # D = p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p))  (DPPO-Binary-KL; verl dppo_kl)
            kl = old_prob * (old - log_probs) + (1 - old_prob) * torch.log((1 - old_prob + 1e-8) / (1 - prob + 1e-8))
            rose_within = (kl <= self.clip_high) | (prob <= old_prob)
            fell_within = (kl <= self.clip_low) | (prob >= old_prob)
        return torch.where(adv > 0, rose_within, fell_within)

    def __call__(self, log_probs, old_log_probs, advantages, mask):
        old, adv, m = prepare_inputs(log_probs, old_log_probs, advantages, mask)
        ratio = torch.exp(torch.clamp(log_probs - old, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).detach()
        kept = self._kept(log_probs.detach(), old, adv)
        # l_t = -A sg[min(r_t, C)] log pi(y_t) on the kept tokens  (Qi et al. 2026 DPPO; verl dppo_tv, dppo_kl)
        loss = -adv * torch.clamp(ratio, max=self.max_ratio) * log_probs * kept.to(log_probs.dtype)
        low_clipped, high_clipped = ~kept & (adv < 0), ~kept & (adv > 0)
        return PolicyLossOutput(zero_masked(loss, m), ratio, m, low_clipped, high_clipped)

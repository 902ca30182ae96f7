"""`SimKO`: PPO's clipped surrogate that spreads a correct response's push over the top-K candidates and presses
harder on the top-1 candidate of an incorrect one, at each response's high-entropy tokens.

Peng et al. 2025, "SimKO: Simple Pass@K Policy Optimization" (arXiv:2510.14807). RLVR concentrates each position's
probability on its top-1 candidate, which lifts pass@1 and lowers pass@K; SimKO acts at the tokens whose entropy
is above the ``entropy_quantile``-quantile of their response's (the forking tokens), asymmetrically:

* a correct response's token: the ratio ``r`` becomes ``(1 - a) r + a/K sum_k sg(r) pi_k / sg(pi_k)`` over the
  policy's current top-K candidates at that position: the same value, with ``a`` of its gradient on the K
  candidates' log-probs instead of the sampled token's (``a = mix_coef``);
* an incorrect response's token (advantage ``< 0``) that is its position's top-1 candidate: the advantage times
  ``negative_scale``;

then ``-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)``, over ``token-mean`` as the authors. The update hands
the loss the policy's current top-K at each position (``reads_top_k``: found in the training forward's own logits,
``Policy.top_k_scores``, their log-probs differentiable), the tokens' entropies (``reads_entropy``) and which
responses are correct (``reads_correctness``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr_lightning.core.losses.policy_loss_base import (
    LOG_RATIO_CLAMP,
    PolicyLoss,
    PolicyLossOutput,
    check_clip,
    clipped_surrogate,
    prepare_inputs,
    zero_masked,
)


def high_entropy_tokens(entropy: Tensor, mask: Tensor, quantile: float) -> Tensor:
    """bool ``[N, T]``: the real tokens whose entropy is above their response's ``quantile``-quantile of its real
    tokens' entropies (linear interpolation, ``torch.quantile``'s; the authors' ``row_quantile_masked``)."""
    thresholds = torch.nanquantile(entropy.float().masked_fill(~mask, float("nan")), quantile, dim=-1, keepdim=True)
    return mask & (entropy > thresholds)


class SimKO(PolicyLoss):
    """SimKO's loss (Peng et al. 2025, arXiv:2510.14807; see the module docstring). Logged: ``simko_boosted`` (the
    share of real tokens whose gradient is spread over the top-K) and ``simko_pressed`` (the share whose negative
    advantage is scaled).

    Args:
        top_k: the candidates a correct response's high-entropy token spreads its push over (the authors' 3).
        mix_coef: the share ``a`` of that push on the candidates (the authors' 0.01).
        entropy_quantile: a response's tokens above this quantile of its entropies are acted on (the authors' 0.8).
        negative_scale: an incorrect response's top-1 tokens' advantage factor (the authors' 1.1).
        clip_low: PPO's clip below (the authors' 0.2).
        clip_high: PPO's clip above (the authors' 0.2).
    """

    reads_entropy = True
    reads_correctness = True

    def __init__(
        self,
        top_k: int = 3,
        mix_coef: float = 0.01,
        entropy_quantile: float = 0.8,
        negative_scale: float = 1.1,
        clip_low: float = 0.2,
        clip_high: float = 0.2,
    ) -> None:
        if top_k < 1:
            raise ValueError(f"SimKO: top_k must be >= 1, got {top_k}")
        if not 0 <= mix_coef <= 1 or not 0 <= entropy_quantile <= 1:
            raise ValueError(
                f"SimKO: mix_coef and entropy_quantile must be in [0, 1], got {mix_coef}, {entropy_quantile}"
            )
        if negative_scale < 0:
            raise ValueError(f"SimKO: negative_scale must be >= 0, got {negative_scale}")
        check_clip("SimKO", "clip_low", clip_low)
        check_clip("SimKO", "clip_high", clip_high)
        self.top_k, self.mix_coef, self.entropy_quantile = top_k, mix_coef, entropy_quantile
        self.negative_scale, self.clip_low, self.clip_high = negative_scale, clip_low, clip_high

    @property
    def reads_top_k(self) -> int:
        return self.top_k

    def __call__(
        self,
        log_probs,
        old_log_probs,
        advantages,
        mask,
        entropy: Tensor | None = None,
        correct: Tensor | None = None,
        top_log_probs: Tensor | None = None,
        top_is_sampled: Tensor | None = None,
    ):
        """``entropy`` ``[N, T]`` (detached), ``correct`` bool ``[N]``, ``top_log_probs`` ``[N, T, K]`` (the policy's
        top-K candidates' log-probs, differentiable) and ``top_is_sampled`` bool ``[N, T, K]``: the update passes
        them."""
        if entropy is None or correct is None or top_log_probs is None or top_is_sampled is None:
            raise ValueError("SimKO needs the entropies, correctness and top-K log-probs; the update passes them")
        old, adv, m = prepare_inputs(log_probs, old_log_probs, advantages, mask)
        real = torch.ones_like(log_probs, dtype=torch.bool) if m is None else m
        high = high_entropy_tokens(entropy, real, self.entropy_quantile)
        log_ratio = (log_probs - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        ratio = log_ratio.exp()
        boosted = high & correct.to(real.device).bool().unsqueeze(-1)
        mix = self.mix_coef * boosted.to(ratio.dtype)
        # sum_k sg(r) pi_k / sg(pi_k): r in value, r grad log pi_k in gradient  (SimKO, the authors'
        # compute_policy_loss_simko: top_i_terms)
        candidates = ratio.detach() * (top_log_probs - top_log_probs.detach()).exp().sum(-1)
        ratio = torch.where(boosted, (1 - mix) * ratio + mix / top_log_probs.shape[-1] * candidates, ratio)
        adv = adv.expand_as(ratio)
        # an incorrect response's top-1 candidates at its forking tokens pressed harder (advantage x lambda)
        pressed = high & top_is_sampled[..., 0] & (adv < 0)
        adv = torch.where(pressed, adv * self.negative_scale, adv)
        loss, ratio_value, low_clipped, high_clipped = clipped_surrogate(ratio, adv, self.clip_low, self.clip_high)
        out = PolicyLossOutput(zero_masked(loss, m), ratio_value, m, low_clipped, high_clipped)
        tokens = real.sum().clamp(min=1).to(ratio.dtype)
        out.extra_stats["simko_boosted"] = boosted.sum() / tokens
        out.extra_stats["simko_pressed"] = pressed.sum() / tokens
        for name in ("simko_boosted", "simko_pressed"):
            out.extra_weights[name] = tokens
        return out

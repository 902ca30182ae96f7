"""`Archer`: PPO's clipped surrogate with a clip range per token by its entropy, and a KL term on the low-entropy
tokens alone.

Wang et al. 2025, "Stabilizing Knowledge, Promoting Reasoning: Dual-Token Constraints for RLVR" (Archer,
arXiv:2507.15778). The tokens of a response whose entropy is above the response's ``quantile``-quantile (0.8: the
top fifth) are the "reasoning" tokens, the others the "knowledge" tokens. A knowledge token keeps a tight clip
(``1 +- clip_low_entropy``) and is held to the reference by ``kl_coef x k3``; a reasoning token gets a looser clip
(``1 +- clip_high_entropy``) and no KL (``high_entropy_kl_coef``, 0). The negative-advantage tokens keep verl's dual
clip (``dual_clip``, 10). As the authors' code (wizard-III/ArcherCodeR 8a1785b: ``dp_actor.py`` and
``compute_policy_loss``): the entropy is the policy's in the update's own forward, detached; the quantile is
``torch.nanquantile``'s (linear) over the response's tokens; each KL term is the mean over its tokens. Their
micro-batches hold one response, so their token mean is a per-response mean: ``seq-mean-token-mean`` here (the
recipe's), under which the KL term below is exactly theirs; under another aggregation its weight follows that one.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr_lightning.core.kl import K3
from rlvr_lightning.core.losses.policy_loss_base import (
    PolicyLoss,
    PolicyLossOutput,
    bounded_surrogate,
    check_clip,
    check_dual_clip,
    dual_clipped,
    prepare_inputs,
    token_ratio,
    zero_masked,
)

#: verl's low_var_kl: k3 with the log-ratio clamped to [-20, 20] and the estimate to [-10, 10]
_KL_CLAMP = 10.0


def low_entropy_tokens(entropy: Tensor, mask: Tensor | None, quantile: float) -> Tensor:
    """``bool[N, T]``: the real tokens whose entropy is at most their response's ``quantile``-quantile over its real
    tokens (linear interpolation; Archer's knowledge tokens). A response without tokens has none."""
    real = torch.ones_like(entropy, dtype=torch.bool) if mask is None else mask.bool()
    masked = torch.where(real, entropy.detach().float(), torch.full_like(entropy, float("nan"), dtype=torch.float))
    # q_i = nanquantile(H_i, 0.8); knowledge tokens H_t <= q_i  (Archer, arXiv:2507.15778 §3.2; ArcherCodeR
    # dp_actor.py, whose "high_entropy_mask" names these low-entropy tokens)
    threshold = torch.nanquantile(masked, quantile, dim=-1, keepdim=True)
    return (masked <= threshold) & real


class Archer(PolicyLoss):
    """Archer's dual-token constraints (see the module docstring). Reads the tokens' entropies (``reads_entropy``)
    and the reference's log-probs (``reads_reference``). Logged: ``archer_low_entropy_frac`` (the knowledge tokens'
    share) and ``archer_kl`` (the k3 mean over them).

    Args:
        quantile: a token above its response's ``quantile``-quantile of entropy is a reasoning token.
        clip_low_entropy: the knowledge tokens' clip, ``1 +- clip_low_entropy`` (the authors' 0.2).
        clip_high_entropy: the reasoning tokens' clip (the authors' 0.5).
        dual_clip: verl's ``clip_ratio_c`` for negative advantages (the authors' 10; None: none).
        kl_coef: the weight of the knowledge tokens' KL to the reference (the authors' 0.001).
        high_entropy_kl_coef: the weight of the reasoning tokens' KL (the authors' 0).
    """

    reads_entropy = True
    reads_reference = True

    def __init__(
        self,
        quantile: float = 0.8,
        clip_low_entropy: float = 0.2,
        clip_high_entropy: float = 0.5,
        dual_clip: float | None = 10.0,
        kl_coef: float = 0.001,
        high_entropy_kl_coef: float = 0.0,
    ) -> None:
        if not 0.0 <= quantile <= 1.0:
            raise ValueError(f"Archer: quantile must be in [0, 1], got {quantile}")
        for name, value in (("clip_low_entropy", clip_low_entropy), ("clip_high_entropy", clip_high_entropy),
                            ("kl_coef", kl_coef), ("high_entropy_kl_coef", high_entropy_kl_coef)):  # fmt: skip
            check_clip("Archer", name, value)
        check_dual_clip("Archer", dual_clip)
        self.quantile, self.dual_clip = quantile, dual_clip
        self.clip_low_entropy, self.clip_high_entropy = clip_low_entropy, clip_high_entropy
        self.kl_coef, self.high_entropy_kl_coef = kl_coef, high_entropy_kl_coef

    def __call__(self, log_probs, old_log_probs, advantages, mask, entropy: Tensor, ref_log_probs: Tensor):
        old, adv, m = prepare_inputs(log_probs, old_log_probs, advantages, mask)
        low = low_entropy_tokens(entropy, m, self.quantile)
        real = torch.ones_like(low) if m is None else m
        eps = torch.where(low, self.clip_low_entropy, self.clip_high_entropy).to(log_probs.dtype)
        loss, ratio_value, low_clipped, high_clipped, extra = self.surrogate(log_probs, old, adv, eps, m)
        kl = K3().estimate(log_probs, ref_log_probs, clamp=_KL_CLAMP)
        lengths = real.sum(-1, keepdim=True).to(log_probs.dtype)
        for coef, tokens in ((self.kl_coef, low), (self.high_entropy_kl_coef, real & ~low)):
            if coef:
                # coef x mean over the class's tokens of k3, spread over the response's tokens: its token mean is the
                # authors' agg_loss(kld, loss_mask=class) (ArcherCodeR dp_actor.py, kl_loss_coef /
                # high_entropy_kl_loss_scale_coef)
                share = lengths / tokens.sum(-1, keepdim=True).clamp(min=1).to(log_probs.dtype)
                loss = loss + torch.where(tokens, coef * kl * share, torch.zeros_like(kl))
        num_low, num_real = low.sum().to(log_probs.dtype), real.sum().to(log_probs.dtype)
        extra["archer_low_entropy_frac"] = num_low / num_real.clamp(min=1)
        extra["archer_kl"] = torch.where(low, kl.detach(), 0.0).sum() / num_low.clamp(min=1)
        weights = {"archer_low_entropy_frac": num_real, "archer_kl": num_low}
        return PolicyLossOutput(zero_masked(loss, m), ratio_value, m, low_clipped, high_clipped, extra, weights)

    def surrogate(
        self, log_probs: Tensor, old_log_probs: Tensor, adv: Tensor, eps: Tensor, mask: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Tensor]]:
        """The per-token policy loss at each token's clip range ``eps``, the detached ratio, where the lower and upper
        clips act, and the statistics."""
        ratio = token_ratio(log_probs, old_log_probs)
        # l_t = max(-A r, -A clip(r, 1 - eps_t, 1 + eps_t)), eps_t by the token's entropy class, then the dual clip
        # (ArcherCodeR core_algos.compute_policy_loss with use_token_entropy_separate)
        loss, ratio_value, low_clipped, high_clipped = bounded_surrogate(ratio, adv, 1.0 - eps, 1.0 + eps)
        loss, extra = dual_clipped(loss, adv, ratio_value, self.dual_clip, mask)
        return loss, ratio_value, low_clipped, high_clipped, extra


class ASPO(Archer):
    """ASPO (arXiv:2510.06062, Asymmetric Importance Sampling Policy Optimization): Archer's entropy classes, with the
    importance weight of the positive-advantage tokens flipped and a soft dual clip.

    A positive token's gradient is weighted by ``1 / r`` instead of ``r`` (a token already made likelier weighs less,
    an unlikely one more), up to ``dual_clip``: its loss is ``-A r^/(sg(r^) sg(r^))``, ``r^ = min(r, 1 + eps_t)``, or
    ``-A c log pi`` once ``1 / r^ > c``. A negative token keeps PPO's ``-A max(r, 1 - eps_t)`` up to ``c``, then
    ``-A c log pi``: past the dual clip both keep a gradient of weight ``c`` (verl's dual clip keeps none). As the
    authors' ``compute_policy_loss_archer`` (wizard-III/Archer2.0 b08d963, clips 0.2 / 0.4, ``c = 3``). The loss
    values are surrogates (only their gradients mean anything); the KL term is Archer's.

    Args: as :class:`Archer`'s, with the authors' ``clip_high_entropy`` 0.4 and ``dual_clip`` 3 (needed: > 1).
    """

    def __init__(
        self,
        quantile: float = 0.8,
        clip_low_entropy: float = 0.2,
        clip_high_entropy: float = 0.4,
        dual_clip: float = 3.0,
        kl_coef: float = 0.001,
        high_entropy_kl_coef: float = 0.0,
    ) -> None:
        if dual_clip is None:
            raise ValueError("ASPO: dual_clip must be a number > 1 (the weight's cap), got None")
        super().__init__(quantile, clip_low_entropy, clip_high_entropy, dual_clip, kl_coef, high_entropy_kl_coef)

    def surrogate(self, log_probs, old_log_probs, adv, eps, mask):
        ratio = token_ratio(log_probs, old_log_probs)
        c = self.dual_clip
        positive = torch.clamp(ratio, max=1.0 + eps)  # r^ = min(r, 1 + eps_t)
        negative = torch.clamp(ratio, min=1.0 - eps)  # r~ = max(r, 1 - eps_t)
        soft = -adv * c * log_probs  # past the dual clip: weight c, with a gradient
        # A > 0: -A r^/(sg(r^) sg(r^)), or -A c log pi where 1/r^ > c; A < 0: -A r~, or -A c log pi where r~ > c
        # (Archer2.0 core_algos.compute_policy_loss_archer)
        positive_loss = torch.where(1.0 / positive.detach() > c, soft, -adv * positive / positive.detach().square())
        negative_loss = torch.where(negative.detach() > c, soft, -adv * negative)
        loss = torch.where(adv < 0, negative_loss, positive_loss)
        ratio_value = ratio.detach()
        low_clipped, high_clipped = (adv < 0) & (ratio_value < 1.0 - eps), (adv > 0) & (ratio_value > 1.0 + eps)
        dual = torch.where(adv < 0, negative.detach() > c, 1.0 / positive.detach() > c)
        real = torch.ones_like(dual) if mask is None else mask
        extra = {"dual_clip_frac": (dual & real).sum().to(ratio.dtype) / real.sum().clamp(min=1).to(ratio.dtype)}
        return loss, ratio_value, low_clipped, high_clipped, extra

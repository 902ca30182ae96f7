"""Losses with a sequence-level importance ratio: GSPO, its length-weighted variant LUSPO, GMPO, and TOPR.

GSPO and LUSPO clip ``s_i = exp(mean_t log(pi_theta / pi_old))``, one ratio per response; GMPO clips each
token's log-ratio first and takes the geometric mean of the clipped ratios. All three route the sequence
ratio's gradient per token (GSPO-token). GSPO also chooses how a token-level correction of the sampler/trainer
mismatch (``rollout_is``) meets that ratio; the peers differ there (see :class:`GSPO`). TOPR weighs the responses
with a negative advantage by their whole trajectory's ratio, truncated at 1, as a stop-gradient weight.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr_lightning.core.losses.policy_loss_base import (
    LOG_RATIO_CLAMP,
    PolicyLoss,
    PolicyLossOutput,
    check_choice,
    check_clip,
    clipped_surrogate,
    prepare_inputs,
    zero_masked,
)
from rlvr_lightning.core.masked import masked_mean

# GSPO's sequence log-ratio is clamped from above at 10 (verl core_algos.compute_policy_loss_gspo)
GSPO_LOG_RATIO_MAX = 10.0
#: ``rollout_is_weight``: each token's own weight, or its row's mean weight (TRL, AReaL)
ROLLOUT_IS_WEIGHTS = ("token", "row_mean")
#: the aggregations GSPO accepts: the paper's, and AReaL's token mean
GSPO_AGGREGATIONS = ("seq-mean-token-mean", "token-mean")
#: ``rollout_is_rejection``: tokens the correction rejects leave the loss after the sequence ratio (TRL) or
#: before it, so that the ratio is over the kept tokens only (AReaL)
ROLLOUT_IS_REJECTIONS = ("after_ratio", "before_ratio")


class GSPO(PolicyLoss):
    """GSPO-token: sequence-level ratio and clipping, gradient routed per token.

    ``s_i = exp(mean_t (logp - old_logp))`` over the masked tokens of row i, and
    ``s_it = sg[s_i] * exp(logp_t - sg[logp_t])`` which equals ``s_i`` in value.
    With ``advantages`` [N] this is exactly GSPO when the loss is aggregated
    with "seq-mean-token-mean" (the paper's 1/G sum_i 1/|y_i| sum_t). It also accepts "token-mean", AReaL's
    aggregation of its sequence-level ratio (each token of the batch weighs the same, so a sequence weighs its
    length); the modes that weigh sequences otherwise (token sums, a constant divisor) are refused.

    With token-level ``rollout_is`` weights ``w_t`` (``core/importance_sampling.py``) the peers differ:

    * ``rollout_is_weight="token"``: token t's loss times its own ``w_t``, so token t's gradient weighs
      ``w_t``. ``"row_mean"``: every token of row i takes the row's mean weight ``mean_t w_t``. Since the
      loss of every token of a row has the same value, the loss value is the same either way; the gradient
      is not. ``"row_mean"`` is what TRL (a ``[B, 1]`` sequence loss times the ``[B, T]`` weights) and AReaL
      (the ratio spread over the row, times each token's weight) compute: the sequence ratio spreads the
      weighted sum over the row.
    * ``rollout_is_rejection="after_ratio"``: a token ``token_mask`` rejects (``w_t = 0``) still counts in
      ``s_i`` (TRL). ``"before_ratio"``: it leaves the row first, so ``s_i``, the row mean and the
      statistics are over the kept tokens only (AReaL's rejection sampling masks before the ratio). The
      aggregation still divides by the row's full length.

    Both options act only with a token-level ``rollout_is`` mode; with a sequence mode (one weight per row)
    every choice gives the same loss and gradient.

    Values and gradients equal TRL 1.16's (``importance_sampling_level="sequence"``, ``loss_type="grpo"``,
    with ``row_mean`` for its vLLM correction) and AReaL's (``row_mean``, ``before_ratio``; ``token-mean``
    aggregation) in ``tests/core/test_losses_against_trl.py``, except that the sequence log-ratio is clamped
    at 10 from above (verl), where neither clamps.

    Args:
        clip_low: the sequence ratio's lower clip is ``1 - clip_low``.
        clip_high: the sequence ratio's upper clip is ``1 + clip_high``.
        rollout_is_weight: ``token`` (each token's weight) or ``row_mean`` (the row's mean weight: TRL, AReaL).
        rollout_is_rejection: ``after_ratio`` (TRL) or ``before_ratio`` (AReaL): whether tokens the correction
            rejects still count in the sequence ratio.
    """

    def __init__(
        self,
        clip_low: float = 3e-4,
        clip_high: float = 4e-4,
        rollout_is_weight: str = "token",
        rollout_is_rejection: str = "after_ratio",
    ) -> None:
        name = type(self).__name__
        check_clip(name, "clip_low", clip_low)
        check_clip(name, "clip_high", clip_high)
        check_choice(name, "rollout_is_weight", rollout_is_weight, ROLLOUT_IS_WEIGHTS)
        check_choice(name, "rollout_is_rejection", rollout_is_rejection, ROLLOUT_IS_REJECTIONS)
        self.clip_low, self.clip_high = clip_low, clip_high
        self.rollout_is_weight, self.rollout_is_rejection = rollout_is_weight, rollout_is_rejection

    def check(self, aggregation: str) -> None:
        if aggregation not in GSPO_AGGREGATIONS:
            raise ValueError(
                f"GSPO is a sequence-level objective; aggregation.mode={aggregation!r} is not one of its aggregations "
                f"{list(GSPO_AGGREGATIONS)} (seq-mean-token-mean: the paper's 1/|y_i| per sequence; token-mean: "
                "AReaL's). Use aggregation: {mode: seq-mean-token-mean}."
            )

    def __call__(self, log_probs, old_log_probs, advantages, mask):
        clip_low, clip_high = self.clip_low, self.clip_high
        old, adv, m = prepare_inputs(log_probs, old_log_probs, advantages, mask)
        # log s_i = 1/|y_i| sum_t log(pi_theta / pi_old)  (Zheng et al. 2025 GSPO eq. 7)
        seq_log_ratio = masked_mean(log_probs.detach() - old, m, dim=-1)
        # s_it = sg[s_i] * pi_theta(y_t) / sg[pi_theta(y_t)]
        # (GSPO §4.3 GSPO-token; verl core_algos.compute_policy_loss_gspo)
        log_s = seq_log_ratio.unsqueeze(-1) + log_probs - log_probs.detach()
        ratio = torch.exp(torch.clamp(log_s, max=GSPO_LOG_RATIO_MAX))
        # l_it = -min(s_it A_i, clip(s_it, 1-eps_low, 1+eps_high) A_i)  (GSPO eq. 5 / §4.3)
        loss, ratio_value, low_clipped, high_clipped = clipped_surrogate(ratio, adv, clip_low, clip_high)
        return PolicyLossOutput(zero_masked(loss, m), ratio_value, m, low_clipped, high_clipped)

    def with_rollout_is(self, log_probs, old_log_probs, advantages, mask, weights: Tensor) -> PolicyLossOutput:
        if self.rollout_is_rejection == "before_ratio":
            # AReaL apply_rejection_sampling: the loss mask loses the rejected tokens before ppo_actor_loss_fn's ratio
            kept = (weights > 0).expand(log_probs.shape)
            mask = kept if mask is None else mask.bool() & kept
        out = self(log_probs, old_log_probs, advantages, mask)
        if self.rollout_is_weight == "row_mean":
            # w_it = 1/|y_i| sum_t w_t  (TRL grpo_trainer: [B, 1] sequence loss * [B, T] importance_sampling_ratio)
            weights = masked_mean(weights.expand(log_probs.shape), out.mask, dim=-1).unsqueeze(-1)
        out.loss = out.loss * weights
        return out


class LUSPO(GSPO):
    """LUSPO: GSPO with each sequence's loss scaled by its length.

    Length-Unbiased Sequence Policy Optimization (arXiv:2602.05261): GSPO's ``1/|y_i|`` per sequence lowers
    the gradient of long responses; LUSPO multiplies each sequence's loss by ``|y_i|``, i.e.
    ``1/G sum_i |y_i| l_i(s_i)``. The per-token loss is GSPO's; the length weight is the aggregation
    "seq-mean-token-sum" (``1/G sum_i sum_t l_it``), the only mode it accepts, which also sums a KL or entropy
    term per sequence as TRL does (``loss_type="luspo"``: ``(per_token_loss * mask).sum(-1).mean()``).

    Where it differs from TRL 1.16 (values and gradients otherwise equal, ``tests/core/test_losses_against_trl.py``):
    the sequence log-ratio is clamped at 10 (verl), and the default clip range is the paper's (TRL's paper
    index recommends it; ``GRPOConfig.epsilon`` defaults to 0.2).

    Args:
        clip_low: the sequence ratio's lower clip is ``1 - clip_low`` (the paper's §5.1: 2e-3).
        clip_high: the sequence ratio's upper clip is ``1 + clip_high`` (the paper's §5.1: 2.5e-3).
        rollout_is_weight: as :class:`GSPO`.
        rollout_is_rejection: as :class:`GSPO`.
    """

    def __init__(
        self,
        clip_low: float = 2e-3,
        clip_high: float = 2.5e-3,
        rollout_is_weight: str = "token",
        rollout_is_rejection: str = "after_ratio",
    ) -> None:
        super().__init__(clip_low, clip_high, rollout_is_weight, rollout_is_rejection)

    def check(self, aggregation: str) -> None:
        if aggregation != "seq-mean-token-sum":
            raise ValueError(
                f"LUSPO weighs each sequence's loss by its length (sum over its tokens); aggregation.mode="
                f"{aggregation!r} would not. Use aggregation: {{mode: seq-mean-token-sum}}."
            )


class GMPO(PolicyLoss):
    """GMPO: the geometric mean of the token ratios, each clipped in log space (Zhao et al. 2025, arXiv:2507.20673).

    With ``d_t = log pi_theta(y_t) - log pi_old(y_t)`` and ``sgn = sign(A_t)``, each token's log-ratio is clipped
    pessimistically, ``c_t = sgn min(sgn d_t, sgn clip(d_t, -clip_low, clip_high))`` (only the side that would
    raise the objective is cut, as in PPO), and response i's loss is ``l_i = -A_i exp(1/|y_i| sum_t c_t)``: the
    geometric mean of the clipped ratios times the row's mean advantage. GRPO's arithmetic mean of
    ``r_t A`` lets one outlier ratio dominate a response; the geometric mean damps it, so GMPO affords the wider
    clip range ``(e^-0.4, e^0.4)``, the paper's and verl's example's default.

    Per token, ``l_it = -A_i sg[R_i] exp(c_t - sg[c_t])`` with ``R_i = exp(mean_t c_t)``: every token of a row holds
    ``l_i`` in value, and the aggregation "seq-mean-token-mean" (the only one accepted: the paper's
    ``1/G sum_i``) gives exactly ``l_i``'s gradient. A ``rollout_is`` correction multiplies each response's
    loss by the geometric mean of its tokens' weights (verl). Values and gradients equal verl's
    ``compute_policy_loss_geo_mean`` (``tests/core/test_gmpo.py``), except that ``d_t`` is clamped to
    ``[-20, 20]`` first (verl leaves that clamp commented out).

    Args:
        clip_low: a token's log-ratio is clipped from below at ``-clip_low`` (ratio ``e^-clip_low``).
        clip_high: a token's log-ratio is clipped from above at ``clip_high`` (ratio ``e^clip_high``).
    """

    def __init__(self, clip_low: float = 0.4, clip_high: float = 0.4) -> None:
        check_clip("GMPO", "clip_low", clip_low)
        check_clip("GMPO", "clip_high", clip_high)
        self.clip_low, self.clip_high = clip_low, clip_high

    def check(self, aggregation: str) -> None:
        if aggregation != "seq-mean-token-mean":
            raise ValueError(
                f"GMPO's objective is the mean of each response's loss; aggregation.mode={aggregation!r} would weigh "
                "responses otherwise. Use aggregation: {mode: seq-mean-token-mean}."
            )

    def __call__(self, log_probs, old_log_probs, advantages, mask):
        old, adv, m = prepare_inputs(log_probs, old_log_probs, advantages, mask)
        log_ratio = torch.clamp(log_probs - old, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        sign = torch.sign(adv)
        # c_t = sgn(A) min(sgn(A) d_t, sgn(A) clip(d_t, -eps_low, eps_high))  (GMPO's token-level clip; verl geo_mean)
        clipped = torch.clamp(log_ratio, -self.clip_low, self.clip_high)
        pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped)
        # R_i = exp(1/|y_i| sum_t c_t), A_i = 1/|y_i| sum_t A_t  (Zhao et al. 2025 GMPO; verl geo_mean)
        seq_ratio = torch.exp(masked_mean(pessimistic.detach(), m, dim=-1)).unsqueeze(-1)
        row_adv = masked_mean(adv.expand(log_probs.shape), m, dim=-1).unsqueeze(-1)
        # l_it = -A_i sg[R_i] exp(c_t - sg[c_t]): l_i in value, (1/|y_i|) sum_t of it has l_i's gradient
        loss = -row_adv * seq_ratio * torch.exp(pessimistic - pessimistic.detach())
        value = log_ratio.detach()
        low_clipped = (value < -self.clip_low) & (adv < 0)
        high_clipped = (value > self.clip_high) & (adv > 0)
        ratio = seq_ratio.expand(log_probs.shape)
        return PolicyLossOutput(zero_masked(loss, m), ratio, m, low_clipped, high_clipped)

    def with_rollout_is(self, log_probs, old_log_probs, advantages, mask, weights: Tensor) -> PolicyLossOutput:
        out = self(log_probs, old_log_probs, advantages, mask)
        log_weights = torch.log(weights.expand(log_probs.shape) + 1e-10)
        # w_i = exp(1/|y_i| sum_t log w_t)  (verl compute_policy_loss_geo_mean: the weights' geometric mean)
        out.loss = out.loss * torch.exp(masked_mean(log_weights, out.mask, dim=-1)).unsqueeze(-1)
        return out


class TOPR(PolicyLoss):
    """TOPR: Tapered Off-Policy REINFORCE (Le Roux et al. 2025, arXiv:2503.14286).

    REINFORCE with an asymmetric, truncated importance weight: a response with a non-negative advantage is
    learned from as it is (``w = 1``, SFT-like however unlikely it has become), one with a negative advantage
    is weighed by its trajectory's ratio ``pi_theta(y) / pi_old(y) = exp(sum_t (logp_t - old_logp_t))``
    truncated to ``[0, 1]``, so that pushing down a response the policy has already left stops. Per token,
    ``l_t = -sg(w) A_t logp_t``. No token leaves the gradient, and the objective is bounded from above.

    The trajectory's log-probability is the sum of its tokens', so the paper's objective is the aggregation
    "seq-mean-token-sum". On-policy (``old_log_probs`` None, or equal) every weight is 1: plain REINFORCE.
    With per-token advantages the sign is taken per token. The statistics report the trajectory ratio;
    ``clip_frac_high`` is the fraction of tokens with ``A < 0`` whose trajectory ratio exceeds 1 (truncated).
    """

    def __call__(self, log_probs, old_log_probs, advantages, mask):
        old, adv, m = prepare_inputs(log_probs, old_log_probs, advantages, mask)
        log_ratio = log_probs.detach() - old
        if m is not None:
            log_ratio = log_ratio.masked_fill(~m, 0.0)
        # log pi_theta(y) / pi_old(y) = sum_t log(pi_theta(y_t) / pi_old(y_t)), clamped as a token's
        seq_log_ratio = torch.clamp(log_ratio.sum(dim=-1, keepdim=True), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        seq_ratio = torch.exp(seq_log_ratio)
        # w = 1 if A >= 0 else [pi_theta(y) / pi_old(y)]_0^1  (Le Roux et al. 2025, TOPR's gradient)
        weight = torch.where(adv >= 0, torch.ones_like(seq_ratio), seq_ratio.clamp(max=1.0))
        # l_t = -sg(w) A_t log pi_theta(y_t)
        loss = -weight * adv * log_probs
        ratio = seq_ratio.expand(log_probs.shape)
        high_clipped = (adv < 0) & (ratio > 1.0)
        return PolicyLossOutput(zero_masked(loss, m), ratio, m, None, high_clipped)

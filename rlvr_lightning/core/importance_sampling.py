"""Importance sampling between the sampler (an inference engine) and the trainer.

An inference engine's kernels and precision differ from the trainer's, so responses are drawn from
pi_sampler while the loss assumes pi_old (the trainer's numbers for the same weights). Yao et al.
2025 ("Your efficient RL framework secretly brings you off-policy RL training") correct the policy
gradient with the ratio w_t = pi_old(y_t) / pi_sampler(y_t), truncated at C (TIS). verl's
`rollout_is` and TRL's `vllm_importance_sampling_correction` offer the same four variants:

* `token_truncate`:    w_t = min(r_t, C)                      (and max(., C_min) when given)
* `token_mask`:        w_t = r_t, or 0 where r_t is outside [C_min, C]
* `sequence_truncate`: w = min(prod_t r_t, C), one weight per response
* `sequence_mask`:     w = prod_t r_t, or 0 (the whole response) where it is outside [C_min, C]

with r_t = exp(log pi_old(y_t) - log pi_sampler(y_t)). Weights carry no gradient.

`mask_off_policy_sequences` is DeepSeek-V3.2's off-policy sequence masking: a response with a negative
advantage whose mean log(pi_sampler / pi_theta) over its tokens exceeds a threshold delta leaves the policy loss.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr_lightning.core.kl import K3
from rlvr_lightning.core.losses.policy_loss_base import PolicyLossOutput
from rlvr_lightning.core.masked import masked_mean

ROLLOUT_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")

# exp() of a larger log-ratio overflows float32 long before any sane cap; every such ratio is capped or masked
_MAX_LOG_RATIO = 20.0


def rollout_is_weights(
    trainer_log_probs: Tensor,
    sampling_log_probs: Tensor,
    mask: Tensor | None,
    mode: str = "token_truncate",
    max_weight: float = 2.0,
    min_weight: float | None = None,
) -> Tensor:
    """Detached importance weights: `[N, T]` for token modes, `[N, 1]` for sequence modes.

    Masked positions have log-ratio 0 (weight 1 in token modes; no part in a sequence's product).
    """
    if mode not in ROLLOUT_IS_MODES:
        raise ValueError(f"rollout_is={mode!r} is not valid; choose one of {list(ROLLOUT_IS_MODES)}")
    if max_weight <= 0 or (min_weight is not None and not 0 <= min_weight < max_weight):
        raise ValueError(f"need 0 <= rollout_is_min < rollout_is_max, got {min_weight} and {max_weight}")
    log_ratio = (trainer_log_probs - sampling_log_probs).detach()
    if mask is not None:
        log_ratio = torch.where(mask.bool(), log_ratio, 0.0)
    if mode.startswith("sequence"):
        # log prod_t r_t = sum_t log r_t  (TRL grpo_trainer "sequence_*" modes)
        log_ratio = log_ratio.sum(dim=-1, keepdim=True)
    ratio = torch.exp(log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    if mode.endswith("truncate"):
        # w = clip(r, C_min, C)  (Yao et al. 2025 TIS; verl rollout_is, TRL *_truncate)
        return ratio.clamp(min=min_weight, max=max_weight)
    # w = r * 1[C_min <= r <= C]  (TRL *_mask, verl rollout_is mask mode)
    outside = ratio > max_weight
    if min_weight is not None:
        outside = outside | (ratio < min_weight)
    return ratio.masked_fill(outside, 0.0)


@torch.no_grad()
def mismatch_stats(
    trainer_log_probs: Tensor, sampling_log_probs: Tensor, mask: Tensor | None, max_weight: float = 2.0
) -> dict[str, Tensor]:
    """How far the sampler's log-probs are from the trainer's on the sampled tokens (masked means):
    mean and max |delta log p|, the k3 estimate of KL(pi_sampler || pi_old) from the sampler's own tokens
    (Schulman 2020), and the token ratios r_t: mean, max and the fraction above `max_weight`."""
    trainer_log_probs, sampling_log_probs = trainer_log_probs.detach(), sampling_log_probs.detach()
    log_ratio = trainer_log_probs - sampling_log_probs
    if mask is not None:
        log_ratio = torch.where(mask.bool(), log_ratio, 0.0)
    ratio = torch.exp(log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    # k3 with p = sampler (it drew the tokens), q = trainer
    k3 = K3()(sampling_log_probs, trainer_log_probs)
    return {
        "abs_diff_mean": masked_mean(log_ratio.abs(), mask),
        "abs_diff_max": log_ratio.abs().max(),
        "k3_kl": masked_mean(k3, mask),
        "is_weight_mean": masked_mean(ratio, mask),
        "is_weight_max": (ratio if mask is None else torch.where(mask.bool(), ratio, 0.0)).max(),
        "capped_fraction": masked_mean((ratio > max_weight).float(), mask),
    }


def off_policy_sequence_mask(
    advantages: Tensor, log_probs: Tensor, sampling_log_probs: Tensor, mask: Tensor | None, threshold: float
) -> Tensor:
    """bool ``[N, 1]`` (``[N, T]`` for per-token advantages): False where a response leaves the policy loss, its
    advantage negative and its mean ``log pi_sampler - log pi_theta`` over its tokens above ``threshold``."""
    divergence = masked_mean(sampling_log_probs - log_probs.detach(), mask, dim=-1).unsqueeze(-1)
    advantages = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    # M_i = 0 iff A_i < 0 and 1/|o_i| sum_t log(pi_old(o_t) / pi_theta(o_t)) > delta  (DeepSeek-AI 2025, DeepSeek-V3.2
    # arXiv:2512.02556 §3.1 eq. 9; checked against TRL f2cd577 trl/trainer/grpo_trainer.py get_off_policy_mask)
    return (advantages >= 0) | (divergence <= threshold)


def mask_off_policy_sequences(
    out: PolicyLossOutput,
    advantages: Tensor,
    log_probs: Tensor,
    sampling_log_probs: Tensor | None,
    mask: Tensor | None,
    threshold: float,
) -> PolicyLossOutput:
    """``out`` with the loss of the responses ``off_policy_sequence_mask`` leaves out set to 0 (no gradient), and
    the fraction of responses left out as ``off_policy_masked_frac``. ``sampling_log_probs`` None: the policy
    sampled these responses itself (nothing is left out)."""
    if sampling_log_probs is None:
        sampling_log_probs = log_probs.detach()
    keep = off_policy_sequence_mask(advantages, log_probs, sampling_log_probs, mask, threshold)
    out.loss = out.loss.masked_fill(~keep, 0.0)
    out.extra_stats["off_policy_masked_frac"] = (~keep).all(dim=-1).to(out.ratio.dtype).mean()
    return out

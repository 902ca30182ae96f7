"""`M2PO`: the importance-weighted surrogate without a clip, trusted by the second moment of its log-ratios.

Zheng, Zhao and Chen 2025, "Prosperity before Collapse: How Far Can Off-Policy RL Reach with Stale Data on LLMs?"
(M2PO, arXiv:2510.01161, Algorithm 1 of its final version): where PPO's clip would act (``A > 0`` and
``r > 1``, or ``A < 0`` and ``r < 1``, ``r = pi_theta / pi_old``), the tokens with the largest squared log-ratio
``M_2 = (log r)^2`` leave the loss until the mean ``M_2`` of those that stay is at most ``m2_threshold``; every
other token keeps ``-A r``, unclipped. A clip bounds every token; the second moment removes only the few extreme
ones, so the high-entropy tokens a clip silences on stale data keep their gradient. Like ``HighEntropyTokens``
the pick is made over the whole mini-batch (``select_tokens``) and the aggregation still divides by every token
(the paper's footnote 2).
"""

from __future__ import annotations

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
from rlvr_lightning.core.losses.token_selection import pick_tokens
from rlvr_lightning.core.masked import masked_mean


def second_moment_keep(log_ratio: Tensor, advantages: Tensor, m2_threshold: float) -> Tensor:
    """bool ``[M]``: the flat tokens M2PO keeps, given their ``log r`` and advantages (``[M]`` each).

    Among the trust-region tokens (``A > 0, log r > 0`` or ``A < 0, log r < 0``) the largest ``(log r)^2`` are
    dropped until the mean of those left is at most ``m2_threshold``; the others are all kept."""
    second = log_ratio.float().square()
    trust = ((advantages > 0) & (log_ratio > 0)) | ((advantages < 0) & (log_ratio < 0))
    # sorted ascending over the trust region (the rest sort last): the longest prefix whose mean <= tau stays
    # (M2PO Algorithm 1; prefix means of sorted values only grow, so the whole region stays when its mean fits)
    values = torch.where(trust, second, torch.inf)
    sorted_values, order = torch.sort(values)
    counts = torch.arange(1, values.numel() + 1, device=values.device, dtype=second.dtype)
    prefix_means = torch.cumsum(torch.where(torch.isinf(sorted_values), 0.0, sorted_values), 0) / counts
    fits = (prefix_means <= m2_threshold) & ~torch.isinf(sorted_values)
    keep_sorted = fits | torch.isinf(sorted_values)  # outside the trust region: always kept
    keep = torch.empty_like(keep_sorted)
    keep[order] = keep_sorted
    return keep


class M2PO(PolicyLoss):
    """``-A r`` without a clip on the tokens M2PO keeps, 0 on the rest (Zheng et al. 2025, arXiv:2510.01161).

    ``r = pi_theta / pi_old`` as the update gives it (the sampler's log-probs when the policy records them exactly,
    else the trainer's at the start of the step). Logged: ``m2_masked_frac``, the fraction of real tokens dropped.

    Args:
        m2_threshold: tau, the bound on the mean squared log-ratio of the trust-region tokens kept (the paper's
            0.04).
    """

    selects_tokens = True

    def __init__(self, m2_threshold: float = 0.04) -> None:
        if not m2_threshold >= 0.0:
            raise ValueError(f"M2PO: m2_threshold must be >= 0, got {m2_threshold}")
        self.m2_threshold = m2_threshold

    def select_tokens(self, log_probs, old_log_probs, advantages, entropy, generator):
        log_ratio = torch.clamp(log_probs - old_log_probs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return second_moment_keep(log_ratio, advantages, self.m2_threshold)

    def __call__(self, log_probs, old_log_probs, advantages, mask, selected: Tensor | None = None):
        """``selected``: the pick over the mini-batch; None: picked among these tokens alone."""
        if selected is None:
            selected = pick_tokens(self, log_probs, old_log_probs, advantages, mask)
        old, adv, m = prepare_inputs(log_probs, old_log_probs, advantages, mask)
        ratio = token_ratio(log_probs, old)
        # l_t = -M_t A r_t, M_t the second-moment mask, no clip  (M2PO eq. 6, Algorithm 1)
        loss = torch.where(selected, -adv * ratio, torch.zeros((), dtype=ratio.dtype, device=ratio.device))
        out = PolicyLossOutput(zero_masked(loss, m), ratio.detach(), m)
        out.extra_stats["m2_masked_frac"] = masked_mean((~selected).to(ratio.dtype), m)
        out.extra_weights["m2_masked_frac"] = (log_probs.new_tensor(log_probs.numel()) if m is None else m.sum()).to(
            ratio.dtype
        )  # a token's share, over the micro-batches
        return out

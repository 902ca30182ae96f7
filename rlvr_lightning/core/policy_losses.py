"""Per-token policy-gradient losses (the thing being MINIMISED), as objects that own their hyper-parameters.

A loss is a :class:`PolicyLoss`: built once (its constructor validates its hyper-parameters), then called
per micro-batch. Every loss takes

* ``log_probs``      ``[N, T]`` log pi_theta(token), differentiable;
* ``old_log_probs``  ``[N, T]`` log pi_old(token) of the behaviour policy, or ``None``;
* ``advantages``     ``[N]`` (one per response, broadcast over tokens) or ``[N, T]``;
* ``mask``           ``[N, T]`` float/bool, 1 = real response token, or ``None``: every token is real;

and returns a :class:`PolicyLossOutput` whose ``loss`` is ``[N, T]``,
UNaggregated and exactly 0 where ``mask == 0`` (aggregate it with
``aggregation.aggregate_loss``). Sign: a positive advantage pushes the token
up, so ``loss = -A * (something increasing in log_probs)``.

``old_log_probs=None`` means "on-policy, first inner step": ``log_probs.detach()``
is used, so every ratio is exactly 1 but its gradient is ``grad log_probs``
(d/dtheta exp(logp - sg(logp)) = grad logp). This lets a single-inner-epoch
run skip the extra forward pass of the old policy.

``stats`` (detached scalar tensors over the masked tokens, computed when read;
``merged_stats`` computes them once over several outputs, e.g. every micro-batch
of a training step):

* ``clip_frac_low``  fraction of tokens where the lower clip is active
  (ratio < 1 - clip_low and A < 0; for CISPO: the IS weight was clipped from below);
* ``clip_frac_high`` fraction where the upper clip is active
  (ratio > 1 + clip_high and A > 0; for CISPO: the IS weight was clipped from above);
* ``ratio_mean``, ``ratio_min``, ``ratio_max`` of the importance ratio
  (GSPO: of the sequence ratio, broadcast to its tokens);
* ``dual_clip_frac`` (ppo_clip with ``dual_clip`` only): A < 0 and ratio > dual_clip.

Losses without a ratio (``pg``) report 0, 0, 1, 1, 1. With an empty mask the
ratio statistics are 1 and the fractions 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from rlvr_lightning.core.masked import join_masked, masked_mean
from rlvr_lightning.core.shorthands import from_shorthand

# |log ratio| is clamped before exp so a stale token cannot produce inf
# (verl core_algos.compute_policy_loss clamps to [-20, 20])
LOG_RATIO_CLAMP = 20.0
# GSPO's sequence log-ratio is clamped from above at 10 (verl core_algos.compute_policy_loss_gspo)
GSPO_LOG_RATIO_MAX = 10.0


@dataclass
class PolicyLossOutput:
    loss: Tensor  # [N, T], zero where mask == 0, not aggregated
    ratio: Tensor  # [N, T] detached importance ratio (ones for losses without one)
    mask: Tensor | None  # [N, T] bool, or None: every token counts
    low_clipped: Tensor | None = None  # [N, T] bool, where the lower clip is active
    high_clipped: Tensor | None = None  # [N, T] bool, where the upper clip is active
    extra_stats: dict[str, Tensor] = field(default_factory=dict)  # loss-specific detached scalars

    @property
    def stats(self) -> dict[str, Tensor]:
        return merged_stats([self])


@torch.no_grad()
def merged_stats(outputs: list[PolicyLossOutput]) -> dict[str, Tensor]:
    """The ``stats`` of all ``outputs`` taken together: fractions and the ratio mean weigh every token
    alike, min and max are over all tokens; ``extra_stats`` are averaged over the outputs."""

    masks = [out.mask for out in outputs]
    ratio, mask = join_masked([out.ratio for out in outputs], masks)

    def clipped(name: str) -> Tensor | None:
        flags = [getattr(out, name) for out in outputs]
        return None if any(f is None for f in flags) else join_masked(flags, masks)[0]

    stats = _stats(ratio, mask, clipped("low_clipped"), clipped("high_clipped"))
    for key in outputs[0].extra_stats:
        stats[key] = torch.stack([out.extra_stats[key] for out in outputs]).mean()
    return stats


# ----------------------------------------------------------------------------- helpers


def _prepare(
    log_probs: Tensor, old_log_probs: Tensor | None, advantages: Tensor, mask: Tensor | None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Validate shapes; return (detached old_log_probs, advantages [N, 1] or [N, T] (broadcast over tokens), bool
    mask or None)."""
    if log_probs.dim() != 2:
        raise ValueError(f"log_probs must be [N, T], got shape {tuple(log_probs.shape)}")
    if mask is not None and mask.shape != log_probs.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} != log_probs shape {tuple(log_probs.shape)}")
    if old_log_probs is None:
        old_log_probs = log_probs.detach()
    elif old_log_probs.shape != log_probs.shape:
        shapes = f"{tuple(old_log_probs.shape)} != log_probs shape {tuple(log_probs.shape)}"
        raise ValueError(f"old_log_probs shape {shapes}")
    elif old_log_probs.requires_grad:
        old_log_probs = old_log_probs.detach()
    if advantages.dtype != log_probs.dtype:
        advantages = advantages.to(log_probs.dtype)
    if advantages.dim() == 1 and advantages.shape[0] == log_probs.shape[0]:
        advantages = advantages.unsqueeze(-1)
    elif advantages.shape != log_probs.shape:
        raise ValueError(
            f"advantages must be [N] or [N, T] with N, T = {tuple(log_probs.shape)}, got {tuple(advantages.shape)}"
        )
    return old_log_probs, advantages, None if mask is None or mask.dtype == torch.bool else mask.bool()


def _token_ratio(log_probs: Tensor, old_log_probs: Tensor) -> Tensor:
    # r_t = pi_theta / pi_old = exp(logp - old_logp)  (Schulman et al. 2017 PPO eq. 6; NOT logp / old_logp)
    return torch.exp(torch.clamp(log_probs - old_log_probs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def _zero_masked(loss: Tensor, mask: Tensor | None) -> Tensor:
    if mask is None:
        return loss
    return torch.where(mask, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))


@torch.no_grad()
def _stats(
    ratio: Tensor, mask: Tensor | None, low_clipped: Tensor | None = None, high_clipped: Tensor | None = None
) -> dict[str, Tensor]:
    """Clip fractions and ratio statistics over the masked tokens, without a host sync (1s for an empty mask)."""
    ratio = ratio.detach()
    if mask is None:
        if ratio.numel() == 0:
            return _stats(ratio, torch.zeros_like(ratio, dtype=torch.bool), low_clipped, high_clipped)
        zero = ratio.new_zeros(())
        return {
            "clip_frac_low": zero if low_clipped is None else low_clipped.sum() / ratio.numel(),
            "clip_frac_high": zero if high_clipped is None else high_clipped.sum() / ratio.numel(),
            "ratio_mean": ratio.mean(),
            "ratio_min": ratio.amin(),
            "ratio_max": ratio.amax(),
        }
    num_tokens = mask.sum().clamp(min=1)
    has_tokens = mask.any()
    zero, one = ratio.new_zeros(()), ratio.new_ones(())
    return {
        "clip_frac_low": zero if low_clipped is None else (low_clipped & mask).sum() / num_tokens,
        "clip_frac_high": zero if high_clipped is None else (high_clipped & mask).sum() / num_tokens,
        "ratio_mean": torch.where(has_tokens, torch.where(mask, ratio, zero).sum() / num_tokens, one),
        "ratio_min": torch.where(has_tokens, torch.where(mask, ratio, math.inf).amin(), one),
        "ratio_max": torch.where(has_tokens, torch.where(mask, ratio, -math.inf).amax(), one),
    }


def _clipped_surrogate(
    ratio: Tensor, adv: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The clipped surrogate's per-token loss, the detached ratio and where the lower and upper clips are active."""
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    neg_adv = -adv
    # l_t = -min(r A, clip(r, 1-eps_low, 1+eps_high) A)  (Schulman et al. 2017 PPO eq. 7)
    loss = torch.maximum(neg_adv * ratio, neg_adv * clipped_ratio)
    ratio_value = ratio.detach()
    low_clipped = (ratio_value < 1.0 - clip_low) & (adv < 0)
    high_clipped = (ratio_value > 1.0 + clip_high) & (adv > 0)
    return loss, ratio_value, low_clipped, high_clipped


def _check_clip(loss: str, name: str, value: float) -> None:
    if value < 0:
        raise ValueError(f"{loss}: {name} must be >= 0, got {value}")


# ----------------------------------------------------------------------------- losses


class PolicyLoss:
    """A per-token policy loss: instances own their hyper-parameters (validated when built).

    Subclass it for a loss of your own and name it in the config by ``class_path`` (any importable module)."""

    #: False: the loss never reads old log-probs (the update then skips computing them)
    needs_old_log_probs: bool = True

    def check(self, aggregation: str) -> None:
        """Raise ValueError if this loss cannot be used with the aggregation mode ``aggregation`` (called when
        the module is built)."""

    def __call__(
        self, log_probs: Tensor, old_log_probs: Tensor | None, advantages: Tensor, mask: Tensor | None
    ) -> PolicyLossOutput:
        """``log_probs`` [N, T] differentiable; ``old_log_probs`` [N, T] or None (on-policy: ``log_probs.detach()``);
        ``advantages`` [N] or [N, T]; ``mask`` [N, T] bool or None (every token real). Returns a
        :class:`PolicyLossOutput` whose ``loss`` is [N, T], unaggregated, 0 where ``mask`` is 0."""
        raise NotImplementedError

    def __repr__(self) -> str:
        options = ", ".join(f"{key}={value!r}" for key, value in vars(self).items())
        return f"{type(self).__name__}({options})"


class PolicyGradient(PolicyLoss):
    """REINFORCE: ``-A * log p``. ``old_log_probs`` is ignored (strictly on-policy)."""

    needs_old_log_probs = False

    def __call__(self, log_probs, old_log_probs, advantages, mask):
        _, adv, m = _prepare(log_probs, old_log_probs, advantages, mask)
        # l_t = -A * log pi_theta(y_t)  (Williams 1992, REINFORCE)
        loss = -adv * log_probs
        return PolicyLossOutput(_zero_masked(loss, m), torch.ones_like(log_probs), m)


class ImportanceRatio(PolicyLoss):
    """Unclipped importance-weighted surrogate: ``-A * exp(logp - old_logp)``."""

    def __call__(self, log_probs, old_log_probs, advantages, mask):
        old, adv, m = _prepare(log_probs, old_log_probs, advantages, mask)
        ratio = _token_ratio(log_probs, old)
        # l_t = -A * r_t  (Schulman et al. 2017 PPO eq. 6, L^CPI, no clipping)
        loss = -adv * ratio
        return PolicyLossOutput(_zero_masked(loss, m), ratio.detach(), m)


class PPOClip(PolicyLoss):
    """Clipped surrogate with separate lower/upper ranges and an optional dual clip.

    Args:
        clip_low: the ratio's lower clip is ``1 - clip_low``.
        clip_high: the ratio's upper clip is ``1 + clip_high`` (None: ``clip_low``); above ``clip_low`` it is
            DAPO's clip-higher.
        dual_clip: a constant ``c > 1`` bounding the loss of negative-advantage tokens with a huge ratio at
            ``-A * c`` (None: no dual clip).
    """

    def __init__(self, clip_low: float = 0.2, clip_high: float | None = None, dual_clip: float | None = None) -> None:
        clip_high = clip_low if clip_high is None else clip_high
        _check_clip("PPOClip", "clip_low", clip_low)
        _check_clip("PPOClip", "clip_high", clip_high)
        if dual_clip is not None and dual_clip <= 1.0:
            raise ValueError(f"PPOClip: dual_clip must be > 1 (or None), got {dual_clip}")
        self.clip_low, self.clip_high, self.dual_clip = clip_low, clip_high, dual_clip

    def __call__(self, log_probs, old_log_probs, advantages, mask):
        clip_low, clip_high, dual_clip = self.clip_low, self.clip_high, self.dual_clip
        old, adv, m = _prepare(log_probs, old_log_probs, advantages, mask)
        ratio = _token_ratio(log_probs, old)
        # asymmetric eps = DAPO clip-higher, Yu et al. 2025 §3.1
        loss, ratio_value, low_clipped, high_clipped = _clipped_surrogate(ratio, adv, clip_low, clip_high)
        extra = {}
        if dual_clip is not None:
            # A < 0: l_t = min(l_t, -A c)  (dual-clip PPO, Ye et al. 2020 "Mastering Complex Control in MOBA Games";
            # verl core_algos.compute_policy_loss clip_ratio_c)
            loss = torch.where(adv < 0, torch.minimum(loss, -adv * dual_clip), loss)
            extra["dual_clip_frac"] = masked_mean(((adv < 0) & (ratio_value > dual_clip)).to(ratio.dtype), m)
        return PolicyLossOutput(_zero_masked(loss, m), ratio_value, m, low_clipped, high_clipped, extra)


class GSPO(PolicyLoss):
    """GSPO-token: sequence-level ratio and clipping, gradient routed per token.

    ``s_i = exp(mean_t (logp - old_logp))`` over the masked tokens of row i, and
    ``s_it = sg[s_i] * exp(logp_t - sg[logp_t])`` which equals ``s_i`` in value.
    With ``advantages`` [N] this is exactly GSPO when the loss is aggregated
    with "seq-mean-token-mean" (the paper's 1/G sum_i 1/|y_i| sum_t), the only mode it accepts.

    Args:
        clip_low: the sequence ratio's lower clip is ``1 - clip_low``.
        clip_high: the sequence ratio's upper clip is ``1 + clip_high``.
    """

    def __init__(self, clip_low: float = 3e-4, clip_high: float = 4e-4) -> None:
        _check_clip("GSPO", "clip_low", clip_low)
        _check_clip("GSPO", "clip_high", clip_high)
        self.clip_low, self.clip_high = clip_low, clip_high

    def check(self, aggregation: str) -> None:
        if aggregation != "seq-mean-token-mean":
            raise ValueError(
                f"GSPO is a sequence-level objective (1/|y_i| per sequence); aggregation.mode={aggregation!r} "
                "would weight sequences by length. Use aggregation: {mode: seq-mean-token-mean}."
            )

    def __call__(self, log_probs, old_log_probs, advantages, mask):
        clip_low, clip_high = self.clip_low, self.clip_high
        old, adv, m = _prepare(log_probs, old_log_probs, advantages, mask)
        # log s_i = 1/|y_i| sum_t log(pi_theta / pi_old)  (Zheng et al. 2025 GSPO eq. 7)
        seq_log_ratio = masked_mean(log_probs.detach() - old, m, dim=-1)
        # s_it = sg[s_i] * pi_theta(y_t) / sg[pi_theta(y_t)]
        # (GSPO §4.3 GSPO-token; verl core_algos.compute_policy_loss_gspo)
        log_s = seq_log_ratio.unsqueeze(-1) + log_probs - log_probs.detach()
        ratio = torch.exp(torch.clamp(log_s, max=GSPO_LOG_RATIO_MAX))
        # l_it = -min(s_it A_i, clip(s_it, 1-eps_low, 1+eps_high) A_i)  (GSPO eq. 5 / §4.3)
        loss, ratio_value, low_clipped, high_clipped = _clipped_surrogate(ratio, adv, clip_low, clip_high)
        return PolicyLossOutput(_zero_masked(loss, m), ratio_value, m, low_clipped, high_clipped)


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
            _check_clip("CISPO", "clip_low", clip_low)
        _check_clip("CISPO", "clip_high", clip_high)
        self.clip_low, self.clip_high = clip_low, clip_high

    def __call__(self, log_probs, old_log_probs, advantages, mask):
        old, adv, m = _prepare(log_probs, old_log_probs, advantages, mask)
        ratio = _token_ratio(log_probs, old).detach()
        lower = None if self.clip_low is None else 1.0 - self.clip_low
        weight = torch.clamp(ratio, min=lower, max=1.0 + self.clip_high)
        # l_t = -sg(clip(r_t, 1-eps_low^IS, 1+eps_high^IS)) * A * log pi_theta(y_t)  (MiniMax-M1 2025, §3.1 eq. 4)
        loss = -weight * adv * log_probs
        low_clipped = None if lower is None else ratio < lower
        high_clipped = ratio > 1.0 + self.clip_high
        return PolicyLossOutput(_zero_masked(loss, m), ratio, m, low_clipped, high_clipped)


# ----------------------------------------------------------------------------- shorthands

#: the names a config may give instead of a class: each stands for its class with its defaults
POLICY_LOSSES: dict[str, type[PolicyLoss]] = {
    "pg": PolicyGradient,
    "ratio": ImportanceRatio,
    "ppo_clip": PPOClip,
    "gspo": GSPO,
    "cispo": CISPO,
}


def policy_loss(value: PolicyLoss | str, option: str = "loss") -> PolicyLoss:
    """``value`` itself, or the built-in loss a shorthand names (with its defaults)."""
    example = "rlvr_lightning.core.policy_losses.PPOClip, or a class of your own"
    return from_shorthand(value, PolicyLoss, POLICY_LOSSES, option, example)

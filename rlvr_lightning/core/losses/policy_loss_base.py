"""The contract of a per-token policy-gradient loss (the thing MINIMISED) and the pieces the built-in losses share.

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
  (GSPO: of the sequence ratio, broadcast to its tokens; GMPO: of the clipped geometric mean);
* ``dual_clip_frac`` (ppo_clip with ``dual_clip`` only): A < 0 and ratio > dual_clip.

Losses without a ratio (``pg``) report 0, 0, 1, 1, 1. With an empty mask the
ratio statistics are 1 and the fractions 0.

A loss that picks tokens by a statistic of the whole mini-batch (``selects_tokens``: the covariance losses of
``core/losses/covariance_losses.py``, ``HighEntropyTokens``) says how in ``select_tokens``; the update computes the
pick over every micro-batch of the mini-batch and every data-parallel rank and hands each micro-batch its part
as ``selected`` (``[N, T]`` bool; or a value per token, 0 at padding: ``BAPO``'s bound). Called without it, the loss
picks within its own inputs.

With a correction of the sampler/trainer mismatch (``rollout_is``) the update calls
:meth:`PolicyLoss.with_rollout_is` instead, which multiplies each token's loss by its weight unless the
loss says otherwise (``GSPO``'s options, ``VESPO``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from rlvr_lightning.core.masked import join_masked, masked_mean

# |log ratio| is clamped before exp so a stale token cannot produce inf
# (verl core_algos.compute_policy_loss clamps to [-20, 20])
LOG_RATIO_CLAMP = 20.0


@dataclass
class PolicyLossOutput:
    loss: Tensor  # [N, T], zero where mask == 0, not aggregated
    ratio: Tensor  # [N, T] detached importance ratio (ones for losses without one)
    mask: Tensor | None  # [N, T] bool, or None: every token counts
    low_clipped: Tensor | None = None  # [N, T] bool, where the lower clip is active
    high_clipped: Tensor | None = None  # [N, T] bool, where the upper clip is active
    extra_stats: dict[str, Tensor] = field(default_factory=dict)  # loss-specific detached scalars
    # an extra statistic's weight when outputs are merged (e.g. the tokens it is a mean over); unnamed: 1
    extra_weights: dict[str, Tensor] = field(default_factory=dict)

    @property
    def stats(self) -> dict[str, Tensor]:
        return merged_stats([self])


@torch.no_grad()
def merged_stats(outputs: list[PolicyLossOutput]) -> dict[str, Tensor]:
    """The ``stats`` of all ``outputs`` taken together: fractions and the ratio mean weigh every token
    alike, min and max are over all tokens; ``extra_stats`` are averaged over the outputs, weighted by their
    ``extra_weights`` where a loss gives them (0 when every weight is 0)."""

    masks = [out.mask for out in outputs]
    ratio, mask = join_masked([out.ratio for out in outputs], masks)

    def clipped(name: str) -> Tensor | None:
        flags = [getattr(out, name) for out in outputs]
        return None if any(f is None for f in flags) else join_masked(flags, masks)[0]

    stats = ratio_stats(ratio, mask, clipped("low_clipped"), clipped("high_clipped"))
    for key in outputs[0].extra_stats:
        values = torch.stack([out.extra_stats[key] for out in outputs])
        if key not in outputs[0].extra_weights:
            stats[key] = values.mean()
            continue
        weights = torch.stack([out.extra_weights[key] for out in outputs]).to(values.dtype)
        stats[key] = (values * weights).sum() / weights.sum().clamp(min=torch.finfo(values.dtype).tiny)
    return stats


# ----------------------------------------------------------------------------- helpers


def prepare_inputs(
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
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.bool()
    return old_log_probs, advantages, mask


def token_ratio(log_probs: Tensor, old_log_probs: Tensor) -> Tensor:
    # r_t = pi_theta / pi_old = exp(logp - old_logp)  (Schulman et al. 2017 PPO eq. 6; NOT logp / old_logp)
    return torch.exp(torch.clamp(log_probs - old_log_probs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def zero_masked(loss: Tensor, mask: Tensor | None) -> Tensor:
    if mask is None:
        return loss
    return torch.where(mask, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))


@torch.no_grad()
def ratio_stats(
    ratio: Tensor, mask: Tensor | None, low_clipped: Tensor | None = None, high_clipped: Tensor | None = None
) -> dict[str, Tensor]:
    """Clip fractions and ratio statistics over the masked tokens, without a host sync (1s for an empty mask)."""
    ratio = ratio.detach()
    if mask is None:
        if ratio.numel() == 0:
            return ratio_stats(ratio, torch.zeros_like(ratio, dtype=torch.bool), low_clipped, high_clipped)
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


def clipped_surrogate(
    ratio: Tensor, adv: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The clipped surrogate's per-token loss, the detached ratio and where the lower and upper clips are active."""
    return bounded_surrogate(ratio, adv, 1.0 - clip_low, 1.0 + clip_high)


def bounded_surrogate(
    ratio: Tensor, adv: Tensor, lower: float | Tensor, upper: float | Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`clipped_surrogate` with the ratio's bounds given (numbers, or tensors broadcast to the ratio's shape)."""
    clipped_ratio = torch.clamp(ratio, lower, upper)
    neg_adv = -adv
    # l_t = -min(r A, clip(r, 1-eps_low, 1+eps_high) A)  (Schulman et al. 2017 PPO eq. 7)
    loss = torch.maximum(neg_adv * ratio, neg_adv * clipped_ratio)
    ratio_value = ratio.detach()
    low_clipped = (ratio_value < lower) & (adv < 0)
    high_clipped = (ratio_value > upper) & (adv > 0)
    return loss, ratio_value, low_clipped, high_clipped


def dual_clipped(
    loss: Tensor, adv: Tensor, ratio_value: Tensor, dual_clip: float | None, mask: Tensor | None
) -> tuple[Tensor, dict[str, Tensor]]:
    """A clipped surrogate's per-token loss with the dual clip ``c`` applied (None: as is) and its statistics."""
    if dual_clip is None:
        return loss, {}
    # A < 0: l_t = min(l_t, -A c)  (dual-clip PPO, Ye et al. 2020 "Mastering Complex Control in MOBA Games";
    # verl core_algos.compute_policy_loss clip_ratio_c)
    loss = torch.where(adv < 0, torch.minimum(loss, -adv * dual_clip), loss)
    clipped = ((adv < 0) & (ratio_value > dual_clip)).to(ratio_value.dtype)
    return loss, {"dual_clip_frac": masked_mean(clipped, mask)}


def check_dual_clip(loss: str, dual_clip: float | None) -> None:
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"{loss}: dual_clip must be > 1 (or None), got {dual_clip}")


def check_clip(loss: str, name: str, value: float) -> None:
    if value < 0:
        raise ValueError(f"{loss}: {name} must be >= 0, got {value}")


def check_choice(loss: str, name: str, value: object, choices) -> None:
    if value not in choices:
        raise ValueError(f"{loss}: {name}={value!r} is not valid; choose one of {list(choices)}")


class PolicyLoss:
    """A per-token policy loss: instances own their hyper-parameters (validated when built).

    Subclass it for a loss of your own and name it in the config by ``class_path`` (any importable module)."""

    #: False: the loss never reads old log-probs (the update then skips computing them)
    needs_old_log_probs: bool = True
    #: True: the loss picks tokens by a statistic of the whole mini-batch (`select_tokens`) and takes the pick
    #: as ``selected`` in ``__call__`` and ``with_rollout_is``
    selects_tokens: bool = False
    #: True: ``select_tokens`` reads the tokens' entropies (the update then computes them)
    selection_reads_entropy: bool = False
    #: True: ``__call__`` and ``with_rollout_is`` take the tokens' detached entropies under the policy being trained
    #: as ``entropy=`` (``[N, T]``; the update computes them)
    reads_entropy: bool = False
    #: True: ``__call__`` and ``with_rollout_is`` take the reference's log-probs as ``ref_log_probs=`` (``[N, T]``;
    #: the module builds a reference for such a loss)
    reads_reference: bool = False
    #: True: ``__call__`` and ``with_rollout_is`` take which rows are demonstrations from the data rather than
    #: sampled responses as ``demonstration_rows=`` (bool ``[N]`` or None: none; the module's ``demonstrations``)
    reads_demonstrations: bool = False
    #: True: ``__call__`` takes each row's prompt group as ``group_index=`` (``[N]``) and the rows a group has as
    #: ``group_size=``; the update keeps every group whole in each micro-batch (``update.shuffle: prompts``)
    reads_groups: bool = False
    #: True: ``__call__`` takes the policy forward's last hidden states at the response positions as ``hidden=``
    #: (``[N, T, H]``, differentiable; position t: the state token t is drawn from; ``Policy.hidden_size`` wide)
    reads_hidden: bool = False
    #: True: ``__call__`` takes a differentiable summary of each row's prompt, ``Policy.prompt_state``, as
    #: ``prompt_state=`` (``[N, H]``; the update computes it beside the policy forward)
    reads_prompt_state: bool = False
    #: K > 0: ``__call__`` takes the policy's current top-K candidates at each position: their log-probs from the
    #: training forward as ``top_log_probs=`` (``[N, T, K]``, differentiable) and which is the sampled token as
    #: ``top_is_sampled=`` (bool ``[N, T, K]``), found in the training forward's logits (``Policy.top_k_scores``)
    reads_top_k: int = 0
    #: True: ``__call__`` takes which responses the task reward calls correct as ``correct=`` (bool ``[N]``)
    reads_correctness: bool = False

    def attach(self, policy) -> torch.nn.Module | None:
        """Called once by the module that trains ``policy`` with this loss. A loss with trainable parameters of its
        own builds them here (e.g. from ``policy.hidden_size``) and returns the ``nn.Module`` that holds them: the
        module then moves, optimises and checkpoints it beside the policy. Here: None."""
        return None

    def select_tokens(
        self, log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, entropy: Tensor | None, generator
    ) -> Tensor:
        """bool ``[M]``: the tokens this loss picks among ``M`` tokens (or a value for each, handed back alike), given
        flat ``[M]`` detached current and old log-probs, advantages and entropies (None unless
        ``selection_reads_entropy``) of the real tokens of a whole mini-batch; ``generator`` (a ``torch.Generator``
        seeded alike on every rank) draws any random choice."""
        raise NotImplementedError

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

    def with_rollout_is(
        self,
        log_probs: Tensor,
        old_log_probs: Tensor | None,
        advantages: Tensor,
        mask: Tensor | None,
        weights: Tensor,
        **inputs: Tensor,
    ) -> PolicyLossOutput:
        """The loss corrected by the sampler/trainer importance weights ``weights`` (detached, ``[N, T]`` for the
        token modes of ``core/importance_sampling.py``, ``[N, 1]`` for the sequence modes; 1 where ``mask`` is 0).
        ``inputs``: what the loss reads besides, as ``__call__`` takes them (``selected``, ``ref_log_probs``, ...).

        Here: each token's loss times its weight. A loss that folds the weights in otherwise overrides this."""
        out = self(log_probs, old_log_probs, advantages, mask, **inputs)
        # l_t <- w_t l_t  (Yao et al. 2025 TIS; verl rollout_is, TRL vllm_importance_sampling_correction)
        out.loss = out.loss * weights
        return out

    def __repr__(self) -> str:
        options = ", ".join(f"{key}={value!r}" for key, value in vars(self).items() if not key.startswith("_"))
        return f"{type(self).__name__}({options})"

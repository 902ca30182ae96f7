"""Tokens a loss picks by a statistic of many tokens (``PolicyLoss.select_tokens``), and `HighEntropyTokens`.

``select_tokens`` works on flat ``[M]`` tensors: the real tokens of a batch, row by row (``flat_tokens``);
``pick_tokens`` runs it on one batch alone and puts the pick back in ``[N, T]`` (``unflatten``). The update
runs it over a whole mini-batch on every data-parallel rank instead (``modules/update/token_selection.py``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr_lightning.core.losses.policy_loss_base import PolicyLoss, PolicyLossOutput, prepare_inputs
from rlvr_lightning.core.masked import masked_mean


def flat_tokens(values: Tensor, mask: Tensor | None) -> Tensor:
    """``[M]`` the values of the real tokens (``mask`` True; None: all), row by row."""
    return values.reshape(-1) if mask is None else values[mask.bool()]


def unflatten(picked: Tensor, mask: Tensor | None, shape: torch.Size) -> Tensor:
    """``shape``: ``picked`` (``[M]``, in ``flat_tokens``' order) at the real tokens, False (0) elsewhere."""
    if mask is None:
        return picked.reshape(shape)
    selected = torch.zeros(shape, dtype=picked.dtype, device=picked.device)
    selected[mask.bool()] = picked
    return selected


def pick_tokens(
    loss: PolicyLoss,
    log_probs: Tensor,
    old_log_probs: Tensor | None,
    advantages: Tensor,
    mask: Tensor | None,
    entropy: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """bool ``[N, T]``: the tokens ``loss`` picks among these alone (one micro-batch on one process)."""
    old, adv, m = prepare_inputs(log_probs, old_log_probs, advantages, mask)
    columns = [log_probs.detach(), old, adv.expand(log_probs.shape)]
    flat = [flat_tokens(column, m) for column in columns]
    flat_entropy = None if entropy is None else flat_tokens(entropy.detach(), m)
    return unflatten(loss.select_tokens(*flat, flat_entropy, generator), m, log_probs.shape)


class HighEntropyTokens(PolicyLoss):
    """The policy gradient of the top ``top_quantile`` fraction of tokens by entropy alone ("forking tokens").

    ``loss``'s per-token loss is kept where the token's entropy is at least the ``1 - top_quantile`` quantile
    of the entropies of the whole mini-batch (on every data-parallel rank), and 0 elsewhere; the aggregation
    still divides by every token, and the KL and entropy terms still see every token (TRL restricts its entropy
    bonus to the same tokens). ``top_quantile=1`` keeps every token, ``0`` the highest.

    Args:
        loss: the policy loss to restrict (a shorthand or a PolicyLoss).
        top_quantile: rho, the fraction of tokens kept (the paper's 0.2).
    """

    selects_tokens = True
    selection_reads_entropy = True

    def __init__(self, loss: PolicyLoss | str = "ppo_clip", top_quantile: float = 0.2) -> None:
        from rlvr_lightning.core.losses.policy_losses import policy_loss  # the shorthands name this class too

        if not 0.0 <= top_quantile <= 1.0:
            raise ValueError(f"HighEntropyTokens: top_quantile must be in [0, 1], got {top_quantile}")
        self.loss = policy_loss(loss, "loss.init_args.loss")
        if self.loss.selects_tokens or self.loss.reads_demonstrations:
            what = "picks tokens itself" if self.loss.selects_tokens else "reads demonstrations"
            raise ValueError(f"HighEntropyTokens: {type(self.loss).__name__} {what}; wrap another loss")
        self.top_quantile = top_quantile

    @property
    def needs_old_log_probs(self) -> bool:
        return self.loss.needs_old_log_probs

    @property
    def reads_entropy(self) -> bool:  # the wrapped loss's (EntropyShapedAdvantage's): handed on as given
        return self.loss.reads_entropy

    def check(self, aggregation: str) -> None:
        self.loss.check(aggregation)

    def select_tokens(self, log_probs, old_log_probs, advantages, entropy, generator):
        if entropy.numel() == 0:
            return torch.zeros_like(entropy, dtype=torch.bool)
        # keep H_t >= the (1 - rho) quantile of the batch's entropies  (Wang et al. 2025, "Beyond the 80/20 Rule",
        # arXiv:2506.01939 §4; checked against TRL f2cd577 trl/trainer/grpo_trainer.py get_high_entropy_mask)
        threshold = torch.quantile(entropy.float(), 1.0 - self.top_quantile)
        return entropy >= threshold

    def __call__(self, log_probs, old_log_probs, advantages, mask, selected=None, entropy: Tensor | None = None):
        inner = self._entropy(entropy)
        return self._keep(self.loss(log_probs, old_log_probs, advantages, mask, **inner), selected)

    def with_rollout_is(self, log_probs, old_log_probs, advantages, mask, weights, selected=None, entropy=None):
        out = self.loss.with_rollout_is(log_probs, old_log_probs, advantages, mask, weights, **self._entropy(entropy))
        return self._keep(out, selected)

    def _entropy(self, entropy: Tensor | None) -> dict[str, Tensor]:
        """The keyword the wrapped loss takes the entropies by, where it reads them."""
        return {"entropy": entropy} if self.loss.reads_entropy else {}

    @staticmethod
    def _keep(out: PolicyLossOutput, selected: Tensor | None) -> PolicyLossOutput:
        if selected is None:
            raise ValueError(
                "HighEntropyTokens picks tokens by their entropy, which the update computes: pass selected= "
                "(pick_tokens(loss, ..., entropy=...)), or train it through RLVRModule"
            )
        out.loss = out.loss.masked_fill(~selected, 0.0)
        out.extra_stats["selected_frac"] = masked_mean(selected.to(out.ratio.dtype), out.mask)
        return out

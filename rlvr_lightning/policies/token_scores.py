"""What `HFScoring` computes from a forward's logits (or hidden states and output layer) at the scored positions:
the chosen tokens' log-probs and entropies, and for logit-level distillation the log-probs of a given support of
tokens (the student's, differentiable) or of the k most probable tokens (the teacher's)."""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor, nn

from rlvr_lightning.core.float32_head import Float32Head
from rlvr_lightning.core.log_probs import (
    linear_token_log_probs,
    support_log_probs_from_logits,
    token_log_probs_and_entropy,
    token_log_probs_from_logits,
    top_log_probs_from_logits,
)
from rlvr_lightning.policies.packing import PackedOutput


class Support(NamedTuple):
    """Which tokens beyond the sampled one to score at each position: the `ids` `[N, T, k]` given, or the `top_k`
    most probable (found without gradient; their ids are returned); their log-probs differentiable either way."""

    ids: Tensor | None = None
    top_k: int = 0

    def at(self, index) -> Support:
        """The support of the positions `index` selects from `[N, T]` (e.g. `[:, :t]`, or packed rows and columns)."""
        return self if self.ids is None else Support(self.ids[index], self.top_k)


class Scores(NamedTuple):
    """`[N, T]` log-probs, entropies and `[N, T, H]` hidden states, `[N, T, k]` the support's log-probs and ids
    (0 on masked positions; None where not asked)."""

    log_probs: Tensor
    entropy: Tensor | None = None
    hidden: Tensor | None = None
    support: Tensor | None = None
    support_ids: Tensor | None = None


def chosen_log_probs(
    logits: Tensor | None,
    hidden: Tensor | None,
    head: nn.Linear | None,
    ids: Tensor,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool,
) -> tuple[Tensor, Tensor | None]:
    """The chosen tokens' log-probs (and entropies) from the logits, or from the hidden states and `head`."""
    if head is not None:
        fp32 = isinstance(head, Float32Head)  # `model.lm_head_fp32`: the GEMMs in float32
        return linear_token_log_probs(hidden, head.weight, head.bias, ids, temperature, with_entropy, float32=fp32)
    if with_entropy:
        return token_log_probs_and_entropy(logits, ids, temperature, entropy_grad)
    return token_log_probs_from_logits(logits, ids, temperature), None


def support_scores(logits: Tensor, support: Support | None, temperature: float) -> tuple[Tensor | None, Tensor | None]:
    """The support's log-probs `[..., k]` from `logits` `[..., V]`, and (top-k) their ids; (None, None) without."""
    if support is None:
        return None, None
    if support.ids is not None:
        return support_log_probs_from_logits(logits, support.ids, temperature), None
    ids = top_log_probs_from_logits(logits, support.top_k, temperature)[1]  # which tokens: no gradient
    return support_log_probs_from_logits(logits, ids, temperature), ids


def last_positions(values: Tensor | None, count: int) -> Tensor | None:
    """The last `count` positions of `[N, L, ...]` values (None stays None)."""
    return None if values is None else values[:, -count:]


def unpacked(values: Tensor, packed: PackedOutput, shape: tuple[int, int]) -> Tensor:
    """`[K, ...]` values of the scored tokens at their `(row, column)` in a zero `[N, T, ...]` tensor."""
    out = values.new_zeros((*shape, *values.shape[1:]))
    return out.index_put((packed.rows, packed.columns), values)


def empty_support(support: Support | None, num_rows: int, like: Tensor) -> tuple[Tensor | None, Tensor | None]:
    """The support's `[N, 0, k]` log-probs and ids of responses without tokens."""
    if support is None:
        return None, None
    k = support.ids.shape[-1] if support.ids is not None else support.top_k
    values = like.new_zeros((num_rows, 0, k))
    return values, (None if support.ids is not None else values.long())

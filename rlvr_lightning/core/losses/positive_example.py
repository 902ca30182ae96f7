"""VAPO's positive-example language-model loss: the negative log-likelihood of the responses that are correct.

With few correct responses in a batch, the policy gradient uses them little; an imitation term on them uses them
more. Added to the policy loss with a weight (VAPO's ``mu``: 0.1), it is normalised by the correct responses'
tokens alone, not by the batch's.
"""

from __future__ import annotations

from torch import Tensor


def positive_example_nll(log_probs: Tensor, correct: Tensor, mask: Tensor | None, num_tokens: Tensor) -> Tensor:
    """Scalar: ``-sum log_probs`` over the real tokens of the rows that are ``correct`` (bool ``[N]``), divided by
    ``num_tokens``, the correct responses' tokens of the whole (mini-)batch, so that micro-batches add up to it.
    ``mask``: ``[N, T]`` bool, None: every token is real."""
    keep = correct.unsqueeze(-1).expand(log_probs.shape)
    if mask is not None:
        keep = keep & mask
    # L_NLL = -1/sum_{o in T} |o| sum_{o in T} sum_t log pi(o_t | q, o_<t), T the correct responses
    # (Yue et al. 2025 VAPO, arXiv:2504.05118, positive example LM loss)
    return -log_probs.where(keep, 0.0).sum() / num_tokens.clamp(min=1)


def correct_token_count(correct: Tensor, mask: Tensor | None, num_positions: int) -> Tensor:
    """The real tokens of the ``correct`` rows (bool ``[N]``): ``mask`` ``[N, T]`` bool, None: all ``num_positions``
    positions of every row are real."""
    if mask is None:
        return correct.sum() * num_positions
    return (mask & correct.unsqueeze(-1)).sum()

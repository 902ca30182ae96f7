"""Entropy of the token distribution (a logged health metric; optionally a bonus)."""

from __future__ import annotations

import torch
from torch import Tensor

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy (nats) of ``softmax(logits / temperature)`` over the last dim -> ``logits.shape[:-1]``.

    Half/bf16 logits are upcast to float32 (the result is float32). Entries
    equal to ``-inf`` are treated as probability-0 tokens.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits.dtype in _LOW_PRECISION:
        logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    probs = torch.softmax(logits, dim=-1)
    # -inf logits (e.g. top-k masked vocab) have probability 0 and contribute 0, not 0 * -inf = NaN
    finite_logits = logits.masked_fill(torch.isneginf(logits), 0.0)
    # H = logsumexp(l) - sum_v softmax(l)_v * l_v  (verl torch_functional.entropy_from_logits)
    return torch.logsumexp(logits, dim=-1) - (probs * finite_logits).sum(dim=-1)


def entropy_from_log_probs(log_probs: Tensor) -> Tensor:
    """Entropy (nats) of a normalised distribution given as log-probabilities over the last dim.

    H = -sum_v p_v log p_v; zero-probability (-inf) entries contribute 0.
    """
    return -(log_probs.exp() * log_probs.masked_fill(torch.isneginf(log_probs), 0.0)).sum(dim=-1)

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


def adaptive_entropy_coefficient(
    coef: float, entropy: float, target: float, delta: float, min_coef: float, max_coef: float
) -> tuple[float, bool]:
    """One step of Skywork-OR1's adaptive entropy control: the next coefficient, and whether the bonus applies.

    While the measured entropy is under ``target`` the coefficient rises by ``delta`` a step and the bonus is on;
    otherwise it falls by ``delta`` and the bonus is off; it stays within ``[min_coef, max_coef]``.
    """
    below = entropy < target
    # c_{k+1} = clip(c_k +- delta, min, max); alpha_{k+1} = c_{k+1} 1[e_k < target]  (He et al. 2025 Skywork-OR1,
    # arXiv:2505.22312 §3.3; the authors' EntController.update, SkyworkAI/Skywork-OR1 64e96af core_algos.py)
    coef = min(max(coef + delta if below else coef - delta, min_coef), max_coef)
    return coef, below

"""Per-token log-probabilities of chosen tokens from logits.

The trainer passes the logits that PREDICT each response token (i.e. already
shifted by one position) and the response token ids.
"""

from __future__ import annotations

import torch
from torch import Tensor

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def token_log_probs_from_logits(logits: Tensor, token_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """``log softmax(logits / temperature)[..., token_ids]`` -> ``[N, T]``.

    Computed as ``gather(logits) - logsumexp(logits)``, which never
    materialises a second ``[N, T, V]`` log-softmax tensor. Half/bf16 logits are
    upcast to float32 first (the result is float32); use the same
    ``temperature`` as the sampler so that log-probs match the behaviour policy.
    """
    logits = _scaled(logits, temperature)
    chosen = torch.gather(logits, dim=-1, index=token_ids.long().unsqueeze(-1)).squeeze(-1)
    # log p(y_t) = l_{y_t} - logsumexp_v l_v  (verl torch_functional.logprobs_from_logits_v2)
    return chosen - torch.logsumexp(logits, dim=-1)


def _scaled(logits: Tensor, temperature: float) -> Tensor:
    """float32 logits divided by the temperature."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits.dtype in _LOW_PRECISION:
        logits = logits.float()
    return logits / temperature if temperature != 1.0 else logits


# rows of the detached entropy computed at once: bounds its [rows, T, V] temporaries
_ENTROPY_CHUNK_ELEMENTS = 1 << 24


def token_log_probs_and_entropy(
    logits: Tensor, token_ids: Tensor, temperature: float = 1.0, entropy_grad: bool = True
) -> tuple[Tensor, Tensor]:
    """``token_log_probs_from_logits`` and the entropy of each position's distribution, from one logsumexp.

    H = log Z - sum_v p_v l_v with p = exp(l - log Z) (verl torch_functional.entropy_from_logits);
    probability-0 (-inf) entries contribute 0. ``entropy_grad=False`` computes the entropy without
    autograd (a logged metric) in row chunks, so none of its ``[.., V]`` temporaries outlive the call.
    """
    logits = _scaled(logits, temperature)
    log_z = torch.logsumexp(logits, dim=-1)
    chosen = torch.gather(logits, dim=-1, index=token_ids.long().unsqueeze(-1)).squeeze(-1)
    log_probs = chosen - log_z
    if entropy_grad:
        return log_probs, _entropy(logits, log_z)
    with torch.no_grad():
        rows = max(1, _ENTROPY_CHUNK_ELEMENTS // max(1, logits[0].numel()))
        chunks = zip(logits.detach().split(rows), log_z.detach().split(rows), strict=True)
        parts = [_entropy(chunk_logits, chunk_log_z) for chunk_logits, chunk_log_z in chunks]
    return log_probs, torch.cat(parts)


def _entropy(logits: Tensor, log_z: Tensor) -> Tensor:
    probs = torch.exp(logits - log_z.unsqueeze(-1))
    # 0 * -inf = NaN on probability-0 tokens: nansum drops them (a NaN logit already made log_z NaN)
    return log_z - (probs * logits).nansum(dim=-1)

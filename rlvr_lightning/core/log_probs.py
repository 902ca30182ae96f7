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
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits.dtype in _LOW_PRECISION:
        logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    chosen = torch.gather(logits, dim=-1, index=token_ids.long().unsqueeze(-1)).squeeze(-1)
    # log p(y_t) = l_{y_t} - logsumexp_v l_v  (verl torch_functional.logprobs_from_logits_v2)
    return chosen - torch.logsumexp(logits, dim=-1)

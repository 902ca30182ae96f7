"""Rows of very uneven lengths for the packing tests: left-padded prompts, right-padded responses, a hole in one
response mask (an inserted observation) and an empty response."""

from __future__ import annotations

import torch

from rlvr_lightning.rollout import Rollout

PROMPT_LENGTHS = [3, 9, 1, 5, 9, 2]
RESPONSE_LENGTHS = [1, 14, 6, 0, 3, 9]


def uneven_rollout(vocab: int = 300, seed: int = 0, prompt_lengths=PROMPT_LENGTHS, response_lengths=RESPONSE_LENGTHS):
    """Rows with left-padded prompts and right-padded responses of the given lengths (pad id 0)."""
    g = torch.Generator().manual_seed(seed)
    n, p, t = len(prompt_lengths), max(prompt_lengths), max(response_lengths)
    prompt_ids = torch.zeros(n, p, dtype=torch.long)
    prompt_mask = torch.zeros(n, p, dtype=torch.long)
    response_ids = torch.zeros(n, t, dtype=torch.long)
    response_mask = torch.zeros(n, t)
    for i, (lp, lr) in enumerate(zip(prompt_lengths, response_lengths, strict=True)):
        prompt_ids[i, p - lp :] = torch.randint(10, vocab, (lp,), generator=g)
        prompt_mask[i, p - lp :] = 1
        response_ids[i, :lr] = torch.randint(10, vocab, (lr,), generator=g)
        response_mask[i, :lr] = 1
    if t > 4 and response_lengths[1] > 4:
        response_mask[1, 2:4] = 0  # an inserted observation: in the context, not scored
    return Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_mask=response_mask,
        group_index=torch.arange(n),
        group_size=1,
        truncated=torch.zeros(n, dtype=torch.bool),
    )

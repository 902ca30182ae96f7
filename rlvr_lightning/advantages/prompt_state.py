"""What an advantage estimator that keeps state per prompt across steps needs: a key for each group's prompt, the
step's groups from every rank, and an order in which a prompt that appears twice in a step is folded in twice.

A prompt is known by a digest of its token ids (its first row's, without padding): the same text sampled again,
in this epoch or a later one, is the same prompt, and a digest of 16 bytes costs the same for any prompt length.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import Tensor

from rlvr_lightning.rollout import Rollout


def prompt_digests(rollout: Rollout) -> list[str]:
    """A digest of each group's prompt tokens (its first row's, without the padding)."""
    first = torch.arange(0, rollout.num_rows, rollout.group_size)
    ids, mask = rollout.prompt_ids[first].cpu(), rollout.prompt_mask[first].cpu().bool()
    digest = lambda tokens: hashlib.blake2b(tokens.numpy().tobytes(), digest_size=16).hexdigest()  # noqa: E731
    return [digest(row[keep]) for row, keep in zip(ids, mask, strict=True)]


def prompt_key(prompt: Any) -> Any:
    """A hashable key for a batch's prompt: text, token ids or chat messages."""
    if isinstance(prompt, Tensor):
        return tuple(prompt.tolist())
    if isinstance(prompt, (list, tuple)):
        return tuple(prompt_key(part) for part in prompt)
    if isinstance(prompt, dict):
        return tuple(sorted((name, prompt_key(value)) for name, value in prompt.items()))
    return prompt


def data_prompt_digest(prompt: Any) -> str:
    """A digest of a prompt as the data gives it (text, token ids or chat messages), before any template."""
    return hashlib.blake2b(repr(prompt_key(prompt)).encode(), digest_size=16).hexdigest()


def gathered(value: Any) -> list[Any]:
    """`value` from every rank, in rank order (`[value]` on one process)."""
    if not distributed():
        return [value]
    parts: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(parts, value)
    return parts


def distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def rank() -> int:
    return torch.distributed.get_rank() if distributed() else 0


def in_waves(keys: list[str]) -> list[list[int]]:
    """The positions of `keys` in waves of distinct keys, in order: a key's second occurrence goes to the wave after
    its first, so folding the waves one after the other folds a repeated prompt in twice, in order."""
    waves: list[list[int]] = []
    pending = list(range(len(keys)))
    while pending:
        wave, later, seen = [], [], set()
        for index in pending:
            (later if keys[index] in seen else wave).append(index)
            seen.add(keys[index])
        waves.append(wave)
        pending = later
    return waves

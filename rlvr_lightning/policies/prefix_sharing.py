"""`HFPolicy` scoring a group's shared prompt once (`generation.share_prompt_prefix`): the prompts run through the
model, then the responses on top of their key/value cache, two forwards per call that skip
`(rows - prompts) x prompt length` positions. When it applies, and the forward itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from rlvr_lightning.generation.kv_cache import cache_argument
from rlvr_lightning.generation.loop import position_ids_from_mask
from rlvr_lightning.policies.token_scores import last_positions

Outputs = tuple[Tensor | None, Tensor | None]


class NotAPlainCache(Exception):
    """The model's key/value cache holds other layers than plain full-attention ones (sliding windows, linear
    attention, ...): its prompts cannot be shared, now or later."""


def prefix_sharing_default(device: torch.device) -> bool:
    """`share_prompt_prefix: null`: on a CPU only. On a CPU scoring is bound by arithmetic, and the skipped positions
    pay; on a GPU a small model's scoring is bound by kernel launches, which the second forward doubles (SmolLM2,
    8 prompts x 8 x 128 tokens under bf16 autocast: 1.9x the kernels for 0.8x the FLOPs of one forward per row,
    `scripts/count_step_work.py`)."""
    return device.type == "cpu"


def layers_allow_prefix_sharing(config: Any, gradient_checkpointing: bool) -> bool:
    """Whether the model's layers keep a plain key/value cache in training: full attention in every layer (no
    sliding window), and no gradient checkpointing (transformers turns the cache off in train mode then)."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    layer_types = getattr(text, "layer_types", None) or ["full_attention"]
    return (
        not gradient_checkpointing
        and not getattr(text, "sliding_window", None)
        and all(kind == "full_attention" for kind in layer_types)
    )


def shared_prefix_forward(
    run: Callable[..., Any],
    model: nn.Module,
    config: Any,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    responses: Tensor,
    with_logits: bool = True,
    with_hidden: bool = False,
) -> Outputs | None:
    """The logits and/or hidden states of `HFScoring._forward_response`, with each distinct prompt run through the
    model once (`run`: `HFScoring._run`, one forward of `model`).

    The rows of a group share their prompt: its key/value cache is computed once (with gradients) and gathered for
    every row, then the responses run on top of it. Same numbers as the joint forward, about
    `len(prompt) * (rows - distinct prompts)` fewer token positions. None when the rows do not share prompts
    (nothing to gain); `NotAPlainCache` when the model's cache is not a plain KV cache.
    """
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    num_rows = prompt_ids.shape[0]
    distinct, inverse = torch.unique(torch.cat([prompt_ids, prompt_mask], dim=1), dim=0, return_inverse=True)
    if distinct.shape[0] * 4 > num_rows * 3:  # under 25% of the prompt tokens saved: one joint forward
        return None
    width = prompt_ids.shape[1]
    unique_ids, unique_mask = distinct[:, :width], distinct[:, width:]
    unique_positions = position_ids_from_mask(unique_mask)
    out = run(
        with_logits,
        with_hidden,
        keep=1,
        input_ids=unique_ids,
        attention_mask=unique_mask,
        position_ids=unique_positions,
        **cache_argument(model, DynamicCache(config=config)),
        use_cache=True,
    )
    cache = out.cache
    if not all(type(layer) is DynamicLayer for layer in getattr(cache, "layers", [None])):
        raise NotAPlainCache(type(cache).__name__)
    first_logits, first_hidden = last_positions(out.logits, 1), last_positions(out.hidden, 1)
    first_logits = None if first_logits is None else first_logits[inverse]
    first_hidden = None if first_hidden is None else first_hidden[inverse]
    del out
    if responses.shape[1] == 0:
        return first_logits, first_hidden
    cache.batch_select_indices(inverse)
    mask = torch.cat([prompt_mask, torch.ones_like(responses, dtype=prompt_mask.dtype)], dim=1)
    start = unique_positions[:, -1][inverse] + 1
    positions = start.unsqueeze(1) + torch.arange(responses.shape[1], device=responses.device)
    out = run(
        with_logits,
        with_hidden,
        keep=0,
        input_ids=responses,
        attention_mask=mask,
        position_ids=positions,
        **cache_argument(model, cache),
        use_cache=True,
    )
    join = lambda first, rest: None if first is None else torch.cat([first, rest], dim=1)  # noqa: E731
    return join(first_logits, out.logits), join(first_hidden, out.hidden)

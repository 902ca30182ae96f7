"""Attention for one query token over a static KV cache, with grouped-query heads and a mask, without copying K/V.

transformers' `sdpa` attention copies every layer's keys and values `num_attention_heads / num_key_value_heads`
times (`repeat_kv`) when a mask is given under `torch.compile` (its copy-free `pack_gqa` path is skipped while
compiling; `enable_gqa` is used only without a mask on CUDA). A decoding step has one query per head, so the
query heads of a group are stacked as `n_rep` queries of their key/value head instead
(`[B, H, 1, D] -> [B, H_kv, n_rep, D]`, as transformers' `pack_gqa`) and attend to the cache as it is.

Registered with transformers' `AttentionInterface` as `ATTENTION_NAME`; `decoding_attention(model)` switches a
model to it for the decoding steps and back afterwards (the prefill, scoring and training keep their own).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
from torch import Tensor, nn

ATTENTION_NAME = "rlvr_decode_sdpa"


def decode_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """`query [B, H, q, D]`, `key/value [B, H_kv, L, D]`, a boolean `attention_mask [B, 1, q, L]` (True: attend).
    One query token: grouped heads stacked as queries of their key/value head; else transformers' sdpa."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, q_length, dim = query.shape
    groups = heads // key.shape[1]
    if q_length != 1 or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    # head h attends with key/value head h // groups (repeat_kv's order), so [B, H, 1, D] -> [B, H_kv, groups, D]
    stacked = query.reshape(batch, heads // groups, groups, dim)
    out = torch.nn.functional.scaled_dot_product_attention(
        stacked, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling
    )
    return out.reshape(batch, heads, 1, value.shape[-1]).transpose(1, 2).contiguous(), None


@functools.cache
def register_decode_attention() -> str:
    """Register `decode_attention_forward` with transformers once; its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, decode_attention_forward)
    return ATTENTION_NAME


def _configs(model: nn.Module) -> list:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if config is None:
        return []
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return [config] if text is config else [config, text]


@contextlib.contextmanager
def decoding_attention(model: nn.Module) -> Iterator[None]:
    """Within the block, `model`'s attention layers use `decode_attention_forward` (its config's
    `_attn_implementation` is restored afterwards)."""
    name = register_decode_attention()
    configs = _configs(model)
    before = [config._attn_implementation for config in configs]
    try:
        for config in configs:
            config._attn_implementation = name
        yield
    finally:
        for config, value in zip(configs, before, strict=True):
            config._attn_implementation = value

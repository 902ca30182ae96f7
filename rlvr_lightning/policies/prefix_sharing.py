"""When `HFPolicy` scores a group's shared prompt once (`generation.share_prompt_prefix`; the forward itself is
`HFScoring._shared_prefix_forward`): the prompts run through the model, then the responses on top of their
key/value cache, two forwards per call that skip `(rows - prompts) x prompt length` positions."""

from __future__ import annotations

from typing import Any

import torch


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

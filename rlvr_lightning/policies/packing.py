"""Padding-free scoring with a Hugging Face causal LM: the rows of a micro-batch run as one packed sequence.

Each row contributes its real prompt tokens and its response up to its last scored token, with position ids
restarting at 0; attention stays within a row:

* sdpa / eager (and flash attention): transformers' masking utilities (>= 4.56) find the rows in the restarting
  position ids when no attention mask is given and build the block-diagonal causal mask themselves
  (`masking_utils.find_packed_sequence_indices`);
* a model class whose module does not use them (remote code) gets an explicit `[1, 1, S, S]` mask;
* flash attention gets the row boundaries as transformers' varlen kwargs too (`cu_seq_lens_q/k`,
  `max_length_q/k`), as its `DataCollatorWithFlattening` passes them;
* FlexAttention (`packed_attention`, `policies/flex_packing.py`) gets a `BlockMask` built from the rows'
  boundaries: no `S x S` mask at all.

Outputs are kept only where they score a response token (`logits_to_keep` takes those positions), so no
padding and no prompt position reaches the LM head or the log-softmax.
"""

from __future__ import annotations

import inspect
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from rlvr_lightning.core.packing import PackedLayout, block_causal_mask, packed_layout
from rlvr_lightning.policies.flex_packing import document_block_mask
from rlvr_lightning.rollout import Rollout


class PackedOutput(NamedTuple):
    logits: Tensor | None  # [K, V]: one row per scored response token
    hidden: Tensor | None  # [K, H]
    rows: Tensor  # long[K]: the row of each scored token
    columns: Tensor  # long[K]: its column in `response_ids`


def scored_lengths(rollout: Rollout) -> Tensor:
    """`long[N]`: each row's response tokens up to and including its last one with mask 1 (0 for none)."""
    mask = rollout.response_mask > 0
    columns = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    return (mask.long() * columns).amax(dim=1) if mask.shape[1] else mask.new_zeros(mask.shape[0], dtype=torch.long)


def row_tokens(rollout: Rollout) -> list[int]:
    """Each row's prompt + scored response tokens: what `update.micro_batch_tokens` counts."""
    return (rollout.prompt_mask.long().sum(-1) + scored_lengths(rollout)).tolist()


def packed_cost(rollout: Rollout) -> int:
    """Positions of the packed forward over `rollout`."""
    prompt = rollout.prompt_mask.long().sum(-1)
    return int((prompt + (scored_lengths(rollout) - 1).clamp(min=0)).sum())


def layout_and_ids(rollout: Rollout) -> tuple[PackedLayout, Tensor]:
    """The packed layout of `rollout`'s rows and its token ids `long[S]`."""
    prompt_mask = rollout.prompt_mask > 0
    prompt_lengths, response_lengths = prompt_mask.long().sum(-1), scored_lengths(rollout)
    if bool(((prompt_lengths == 0) & (response_lengths > 0)).any()):
        raise ValueError("packed scoring: a row with response tokens has an empty prompt")
    columns = torch.arange(rollout.response_ids.shape[1], device=prompt_mask.device)
    keep = torch.cat([prompt_mask, columns < (response_lengths - 1).unsqueeze(1)], dim=1)
    ids = torch.cat([rollout.prompt_ids, rollout.response_ids], dim=1)[keep]  # row by row: prompt, then response
    return packed_layout(prompt_lengths, response_lengths), ids


def builds_packed_mask(model: nn.Module) -> bool:
    """Whether `model`'s attention mask comes from transformers' masking utilities, which detect packed rows from
    restarting position ids (else the caller passes an explicit block-diagonal mask)."""
    try:
        from transformers import masking_utils
    except ImportError:
        return False
    if not hasattr(masking_utils, "find_packed_sequence_indices"):
        return False
    module = inspect.getmodule(type(model))
    return getattr(module, "create_causal_mask", None) is masking_utils.create_causal_mask


def packed_inputs(
    model: nn.Module, config: Any, layout: PackedLayout, ids: Tensor, dtype: torch.dtype, flex: bool = False
) -> dict:
    """The forward's keyword arguments for one packed sequence (batch of 1); `flex`: for FlexAttention."""
    inputs: dict[str, Any] = {
        "input_ids": ids.unsqueeze(0),
        "position_ids": layout.position_ids.unsqueeze(0),
        "use_cache": False,
    }
    implementation = str(getattr(config, "_attn_implementation", None) or "")
    if flex:
        inputs["attention_mask"] = document_block_mask(layout.document_ids)
    elif "flash" in implementation:
        cu_seqlens = layout.cu_seqlens.to(ids.device)
        inputs.update(
            cu_seq_lens_q=cu_seqlens,
            cu_seq_lens_k=cu_seqlens,
            max_length_q=layout.max_length,
            max_length_k=layout.max_length,
        )
    elif not builds_packed_mask(model):
        inputs["attention_mask"] = block_causal_mask(layout.position_ids, dtype)
    return inputs

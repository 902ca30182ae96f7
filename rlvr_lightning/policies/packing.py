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


class RowLengths(NamedTuple):
    """Per-row sizes of a rollout on the host, read from the device at once (one synchronisation), so that the
    micro-batches of a mini-batch are laid out without reading the device again."""

    prompt: list[int]  # real prompt tokens
    scored: list[int]  # `scored_lengths`
    prompt_hash: list[int]  # equal for rows with equal prompt ids and mask (what prefix sharing shares)

    def subset(self, rows: list[int]) -> RowLengths:
        return RowLengths(*([values[i] for i in rows] for values in self))


def remembered_row_lengths(rollout: Rollout) -> RowLengths | None:
    """The `RowLengths` remembered on `rollout` (`remember_row_lengths`) while its masks are the same tensors."""
    remembered = rollout.__dict__.get("_row_lengths")
    if remembered is not None and remembered[0] is rollout.prompt_mask and remembered[1] is rollout.response_mask:
        return remembered[2]
    return None


def row_lengths(rollout: Rollout) -> RowLengths:
    """`rollout`'s `RowLengths`: remembered on the rollout, else read now (and remembered)."""
    remembered = remembered_row_lengths(rollout)
    if remembered is not None:
        return remembered
    mask = rollout.prompt_mask.long()
    # a multiplicative hash of each padded prompt row, in int64 arithmetic (wrapping on overflow)
    columns = torch.arange(mask.shape[1], device=mask.device)
    weights = (columns * 0x1E3779B97F4A7C15 + 0x232BE59BD9B4E019) | 1  # odd: a bijection per column mod 2^64
    hashed = ((rollout.prompt_ids * 2 + 1) * mask * weights).sum(-1)
    lengths = RowLengths(*torch.stack([mask.sum(-1), scored_lengths(rollout), hashed]).tolist())
    remember_row_lengths(rollout, lengths)
    return lengths


def remember_row_lengths(rollout: Rollout, lengths: RowLengths) -> None:
    """Have `row_lengths(rollout)` answer `lengths` without a read (as long as its masks are these tensors)."""
    rollout.__dict__["_row_lengths"] = (rollout.prompt_mask, rollout.response_mask, lengths)


def row_tokens(rollout: Rollout) -> list[int]:
    """Each row's prompt + scored response tokens: what `update.micro_batch_tokens` counts."""
    lengths = row_lengths(rollout)
    return [p + s for p, s in zip(lengths.prompt, lengths.scored, strict=True)]


def packed_cost(lengths: RowLengths) -> int:
    """Positions of the packed forward over rows of these lengths."""
    return sum(p + max(s - 1, 0) for p, s in zip(lengths.prompt, lengths.scored, strict=True))


def layout_and_ids(rollout: Rollout) -> tuple[PackedLayout, Tensor]:
    """The packed layout of `rollout`'s rows and its token ids `long[S]`, without a host read when its
    `row_lengths` are remembered."""
    lengths = row_lengths(rollout)
    if any(p == 0 and s > 0 for p, s in zip(lengths.prompt, lengths.scored, strict=True)):
        raise ValueError("packed scoring: a row with response tokens has an empty prompt")
    device = rollout.prompt_ids.device
    host = packed_layout(lengths.prompt, lengths.scored)
    layout = layout_to(host, device)
    total = host.position_ids.numel()
    columns = torch.arange(rollout.response_ids.shape[1], device=device)
    keep = torch.cat([rollout.prompt_mask > 0, columns < (scored_lengths(rollout) - 1).unsqueeze(1)], dim=1)
    flat = keep.flatten()
    # row by row: prompt, then response; the kept tokens' slots in order, the others into a spare last slot
    slots = torch.where(flat, flat.cumsum(0) - 1, total)
    tokens = torch.cat([rollout.prompt_ids, rollout.response_ids], dim=1).flatten()
    ids = tokens.new_zeros(total + 1).scatter_(0, slots, tokens)[:total]
    return layout, ids


def layout_to(layout: PackedLayout, device: torch.device) -> PackedLayout:
    """`layout` on `device`: its index tensors in one copy, queued without waiting for the device."""
    if device.type == "cpu":
        return layout
    tensors = [t for t in layout if isinstance(t, Tensor)]
    sizes = [t.numel() for t in tensors]
    joined = torch.cat([t.long() for t in tensors])
    moved = joined.pin_memory().to(device, non_blocking=True).split(sizes)
    fields = iter(m.to(t.dtype) for m, t in zip(moved, tensors, strict=True))
    return PackedLayout(*(next(fields) if isinstance(value, Tensor) else value for value in layout))


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

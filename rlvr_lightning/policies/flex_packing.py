"""Packed scoring through FlexAttention: the rows of a packed sequence attend within themselves by a `BlockMask`
built from their boundaries (`core/packing.py: document_causal_blocks`), never by a dense `S x S` mask.

`HFPolicy(model=HFModelOptions(packed_attention=...))` picks the kernel of packed scoring:

* `"auto"` (default): FlexAttention on a CUDA device where the model allows it (below) and its own
  implementation is sdpa or eager (which would build a dense mask), else `"model"`; where FlexAttention fails to
  compile (no working Triton), a warning with the error and `"model"` from then on;
* `"flex"`: FlexAttention (an error where the model does not allow it);
* `"model"`: the model's own `attn_implementation` (sdpa, eager: transformers' block-diagonal mask from the
  restarting position ids; flash attention: its varlen kwargs).

The forward runs with the model's attention implementation switched to `rlvr_packed_flex` for its duration: a
function registered in transformers' `AttentionInterface` that calls `flex_attention` with the `BlockMask`
(passed as the 4D `attention_mask`, which transformers' masking utilities hand through as it is) and
`enable_gqa`, so grouped key/value heads are never copied per query head. It is compiled on a CUDA device
(the fused kernel); elsewhere (FlexAttention has no backward on a CPU) the same tiles are expanded into an
`S x S` mask for SDPA, a reference for tests (`"auto"` never picks FlexAttention there).

The model allows it when it builds its masks with transformers' masking utilities, has full attention in every
layer (no sliding window), no attention-logit soft-capping or sinks, and no gradient checkpointing (whose
backward recomputes the layers after the forward has switched the implementation back).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlvr_lightning.core.packing import document_causal_blocks

#: the values of `HFPolicy.packed_attention`
PACKED_ATTENTION = ("auto", "flex", "model")
#: the name our FlexAttention function is registered under in transformers' `AttentionInterface`
FLEX_IMPLEMENTATION = "rlvr_packed_flex"
#: FlexAttention's tile (torch's `_DEFAULT_SPARSE_BLOCK_SIZE`)
BLOCK_SIZE = 128


def flex_refusal(model: nn.Module, config: Any, checkpointing: bool, device: torch.device) -> str | None:
    """Why `model` cannot score packed rows through FlexAttention on `device` (None: it can)."""
    from rlvr_lightning.policies.packing import builds_packed_mask

    if not flex_available():
        return "this torch has no FlexAttention"
    # the backward would recompute the layers after the implementation is switched back
    wrapped = any("CheckpointWrapper" in type(module).__name__ for module in model.modules())  # e.g. under FSDP
    if checkpointing or getattr(model, "is_gradient_checkpointing", False) or wrapped:
        return "gradient checkpointing is on"
    if not builds_packed_mask(model):
        return f"{type(model).__name__} does not build its masks with transformers' masking utilities"
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    if getattr(text, "sliding_window", None) or any(
        kind != "full_attention" for kind in getattr(text, "layer_types", None) or ["full_attention"]
    ):
        return "the model has sliding-window (or other non-full) attention layers"
    if getattr(text, "attn_logit_softcapping", None):
        return "the model soft-caps its attention logits"
    if any(getattr(module, "sinks", None) is not None for module in model.modules()):
        return "the model's attention has sinks"
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    if device.type == "cuda" and head_dim < 16:  # inductor's flex kernel (tl.dot) refuses E < 16 on CUDA
        return f"FlexAttention's CUDA kernel needs a head size of at least 16, and the model's is {head_dim}"
    return None


def use_flex(choice: str, model: nn.Module, config: Any, device: torch.device, checkpointing: bool) -> bool:
    """Whether packed scoring runs through FlexAttention under `packed_attention=choice`."""
    if choice == "model" or (choice == "auto" and device.type != "cuda"):
        return False
    if choice == "auto" and config._attn_implementation not in ("sdpa", "eager"):
        return False  # flash attention's varlen kernel needs no mask either
    refusal = flex_refusal(model, config, checkpointing, device)
    if refusal is None:
        return True
    if choice == "flex":
        raise ValueError(f"HFPolicy model.packed_attention='flex': {refusal}; valid here: auto, model")
    return False


def flex_compile_failed(policy: Any, device: torch.device, error: Exception) -> None:
    """`packed_attention="auto"` whose FlexAttention kernel failed to compile on this machine: warn with the error
    and score packed rows with the model's own kernel from now on (the failed forward is run again with it)."""
    warnings.warn(
        f"HFPolicy: compiling FlexAttention for packed scoring failed, so packed rows use the model's own attention "
        f"({policy.hf_config._attn_implementation}) from now on; `model.packed_attention: model` chooses that "
        f"without trying. The error: {type(error).__name__}: {(str(error).splitlines() or [''])[0]}",
        stacklevel=3,
    )
    policy.__dict__.setdefault("_packed_kernels", {})[policy._packed_kernel_key(device)] = False


@functools.cache
def flex_available() -> bool:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def document_block_mask(document_ids: Tensor, block_size: int | None = None):
    """The `BlockMask` of one packed sequence (batch 1, every head alike) whose position `i` belongs to row
    `document_ids[i]` (non-decreasing): causal within a row, nothing across rows. Tiles of `BLOCK_SIZE`."""
    from torch.nn.attention.flex_attention import BlockMask

    block_size = block_size or BLOCK_SIZE
    tiles = document_causal_blocks(document_ids, block_size)

    def within_row(batch, head, q, k):
        return (document_ids[q] == document_ids[k]) & (k <= q)

    total = document_ids.numel()
    batched = [t[None, None] for t in tiles]  # [B=1, H=1, ...]
    return BlockMask.from_kv_blocks(
        *batched, BLOCK_SIZE=block_size, mask_mod=within_row, seq_lengths=(total, total)
    )  # fmt: skip


@functools.cache
def _compiled_flex_attention():
    """`torch.compile(flex_attention)` whose backward is compiled with its forward, not at the first backward: a
    kernel that cannot build on this machine fails inside the forward, where `packed_attention="auto"` falls back
    to the model's own attention (`flex_compile_failed`), not later in `loss.backward()`."""
    from torch._functorch import config as functorch_config
    from torch.nn.attention.flex_attention import flex_attention

    compiled = torch.compile(flex_attention)

    def run(*args: Any, **kwargs: Any) -> Tensor:
        with functorch_config.patch(force_non_lazy_backward_lowering=True):
            return compiled(*args, **kwargs)

    return run


def _flex_kernel():
    """The compiled kernel; inside a model that is itself being compiled, the plain function (compiled with it)."""
    if torch.compiler.is_compiling():
        from torch.nn.attention.flex_attention import flex_attention

        return flex_attention
    return _compiled_flex_attention()


def packed_flex_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    s_aux: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention-function signature: `[B, H, S, D]` query, `[B, H_kv, S, D]` key and value, the
    `BlockMask` as `attention_mask`; returns `[B, S, H, D]`. On a CUDA device the compiled FlexAttention kernel;
    elsewhere (FlexAttention has no backward on a CPU) the reference: the same tiles expanded into a mask."""
    from torch.nn.attention.flex_attention import BlockMask

    if not isinstance(attention_mask, BlockMask):
        raise TypeError(f"{FLEX_IMPLEMENTATION} takes a BlockMask, got {type(attention_mask).__name__}")
    if dropout > 0 or softcap is not None or s_aux is not None:
        raise ValueError(f"{FLEX_IMPLEMENTATION}: attention dropout, soft-capping and sinks are not supported")
    gqa = query.shape[1] != key.shape[1]
    if query.device.type == "cuda":
        out = _flex_kernel()(query, key, value, block_mask=attention_mask, scale=scaling, enable_gqa=gqa)
    else:
        allowed = expanded_block_mask(attention_mask)
        out = F.scaled_dot_product_attention(query, key, value, allowed, scale=scaling, enable_gqa=gqa)
    return out.transpose(1, 2).contiguous(), None


def expanded_block_mask(block_mask) -> Tensor:
    """`bool[S_q, S_kv]`: what FlexAttention computes for a batch-1, one-head `BlockMask`: nothing in a skipped
    tile, everything in a full tile, the mask function's answer in a partial tile (a reference: `S x S`)."""
    q_len, kv_len = block_mask.seq_lengths
    q_block, kv_block = block_mask.BLOCK_SIZE
    tiles = -(-kv_len // kv_block)
    partial = _tile_matrix(block_mask.kv_num_blocks[0, 0], block_mask.kv_indices[0, 0], tiles)
    full = torch.zeros_like(partial)
    if block_mask.full_kv_num_blocks is not None:
        full = _tile_matrix(block_mask.full_kv_num_blocks[0, 0], block_mask.full_kv_indices[0, 0], tiles)
    device = partial.device
    q, k = torch.arange(q_len, device=device)[:, None], torch.arange(kv_len, device=device)[None, :]
    tile_q, tile_k = q // q_block, k // kv_block
    zero = torch.zeros((), dtype=torch.long, device=device)
    return full[tile_q, tile_k] | (partial[tile_q, tile_k] & block_mask.mask_mod(zero, zero, q, k))


def _tile_matrix(counts: Tensor, indices: Tensor, tiles: int) -> Tensor:
    """`bool[Bq, tiles]` from per-row counts and listed tile indices (FlexAttention's compressed form)."""
    listed = torch.arange(indices.shape[-1], device=indices.device) < counts[:, None]
    hits = torch.zeros(indices.shape[0], tiles, dtype=torch.int32, device=indices.device)
    return hits.scatter_add_(1, indices.long(), listed.to(torch.int32)) > 0


@functools.cache
def register_flex_attention() -> None:
    """Make `FLEX_IMPLEMENTATION` a name transformers' attention modules dispatch to (once per process)."""
    from transformers import AttentionInterface

    AttentionInterface.register(FLEX_IMPLEMENTATION, packed_flex_attention)


@contextlib.contextmanager
def attention_implementation(config: Any, name: str) -> Iterator[None]:
    """The model of `config` runs its attention through `name` inside the block (its own again after)."""
    previous = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = previous

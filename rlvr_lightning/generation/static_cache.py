"""The device state of static decoding (`generation/static_generation.py`): buffers allocated once and updated in
place, so that a CUDA graph (or `torch.compile`'s `reduce-overhead`) can hold a decoding step.

`DecodeWorkspace` holds, for `rows` rows (a bucket: the batch rounded up) and `capacity` cache slots:

* a transformers `StaticCache` (every layer's keys and values preallocated, written at a device counter);
* the attention mask as a 4D boolean `[rows, 1, 1, capacity]` (transformers takes a 4D mask as it is, without
  reading it on the host), each row's next position, the next cache slot and the decoding step as device tensors;
* the token each row feeds next, its uniform draw, whether it is still decoding (`alive`: EOS and per-row caps are
  checked on the device; a finished row is fed pad instead of being dropped), and the sampled tokens and
  log-probs of every step.

Rows are laid out as in our eager loop: the left-padded prompts fill slots `0 .. P-1` and the token of step `t`
lands in slot `P + t`, so a prompt length `P` is only a device value here and prompts of another length reuse the
same buffers (and graph) while `P + max_new_tokens <= capacity`.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from rlvr_lightning.generation.kv_cache import cache_argument, returned_cache

CAPACITY_STEP = 64  # cache slots are allocated in multiples of this (prompts of other lengths reuse a workspace)
DEVICE_COUNTER_RELEASE = "5.4"  # the first transformers whose `StaticLayer` counts its length in a device tensor


def text_config(model: nn.Module):
    """The decoder's config of a transformers model (or of a PEFT model's base)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = base.config
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def static_cache_support(model: nn.Module) -> str | None:
    """Why `model` cannot decode with a static cache, or None: a transformers model whose every layer is full
    attention (sliding-window and linear-attention layers keep other slots) and that takes custom attention
    functions and full-graph compilation, on a transformers whose static cache counts its length on the device."""
    from transformers.cache_utils import StaticCache, StaticLayer

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    name = type(base).__name__
    if not hasattr(base, "config"):
        return f"{name} is not a transformers model"
    if not getattr(base, "_supports_attention_backend", False) or not getattr(base, "_can_compile_fullgraph", False):
        return f"{name} does not take custom attention functions and a compiled static cache"
    try:
        layers = StaticCache(config=text_config(model), max_cache_len=CAPACITY_STEP).layers
    except Exception as error:  # noqa: BLE001 - any config transformers cannot build a static cache for
        return f"transformers builds no static cache for {name}: {error}"
    if not layers or any(type(layer) is not StaticLayer for layer in layers):
        return f"{name} has layers other than full attention (sliding window, linear attention)"
    return static_length_on_host(layers[0])


def static_length_on_host(layer=None) -> str | None:
    """Why this transformers' static cache cannot be advanced by a captured step (its `StaticLayer` counts its
    length on the host: releases before `DEVICE_COUNTER_RELEASE`), or None."""
    from transformers.cache_utils import StaticLayer

    layer = layer if layer is not None else StaticLayer(max_cache_len=CAPACITY_STEP)
    if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
        return None
    import transformers

    return (
        f"transformers {transformers.__version__} keeps its static cache's length on the host, which a captured "
        f"step cannot advance (transformers >= {DEVICE_COUNTER_RELEASE} keeps it on the device)"
    )


def prefill(model: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor) -> tuple:
    """The distinct prompts' forward `[B, P]`, as our eager loop's prefill: (its `DynamicCache`, the last logits
    `[B, V]`, the positions `[B, P]`)."""
    from transformers import DynamicCache

    from rlvr_lightning.generation.loop import _supports_logits_to_keep, position_ids_from_mask

    positions = position_ids_from_mask(prompt_mask)
    keep = {"logits_to_keep": 1} if _supports_logits_to_keep(model) else {}
    out = model(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=positions,
        use_cache=True,
        **cache_argument(model, DynamicCache()),
        **keep,
    )
    return returned_cache(out), out.logits[:, -1, :], positions


def weight_addresses(model: nn.Module) -> list[int]:
    return [tensor.data_ptr() for tensor in (*model.parameters(), *model.buffers())]


def row_bucket(rows: int) -> int:
    """The workspace's rows for a batch of `rows`: the next power of two, so that a few graphs serve every batch."""
    return 1 << max(rows - 1, 0).bit_length()


def capacity_for(length: int) -> int:
    return -(-length // CAPACITY_STEP) * CAPACITY_STEP


class DecodeWorkspace:
    """Static decoding's device state for `rows` rows and `capacity` cache slots (see the module's docstring)."""

    @torch.inference_mode(False)  # built under `trainer.validate` (inference mode), updated in place by training
    def __init__(self, model: nn.Module, rows: int, capacity: int, key_like: Tensor, value_like: Tensor) -> None:
        from transformers.cache_utils import StaticCache

        device = key_like.device
        self.rows, self.capacity, self.device = rows, capacity, device
        self.cache = StaticCache(config=text_config(model), max_cache_len=capacity)
        heads, key_dim, value_dim = key_like.shape[1], key_like.shape[-1], value_like.shape[-1]
        key_dtype, value_dtype = step_cache_dtype(key_like), step_cache_dtype(value_like)
        for layer in self.cache.layers:  # allocated now (and marked as static addresses), not at the first write
            layer.lazy_initialization(
                key_like.new_empty((rows, heads, 1, key_dim)), value_like.new_empty((rows, heads, 1, value_dim))
            )
            if layer.keys.dtype != key_dtype:
                layer.keys = torch.zeros_like(layer.keys, dtype=key_dtype)
                torch._dynamo.mark_static_address(layer.keys)
                layer.update = functools.partial(_update_casting_keys, layer.update, key_dtype)
            if layer.values.dtype != value_dtype:
                layer.values = torch.zeros_like(layer.values, dtype=value_dtype)
                torch._dynamo.mark_static_address(layer.values)
        self.cache_kwargs = cache_argument(model, self.cache)

        def zeros(*shape: int, dtype: torch.dtype = torch.long) -> Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.mask = zeros(rows, 1, 1, capacity, dtype=torch.bool)
        self.positions, self.slot, self.step = zeros(rows), zeros(1), zeros(1)
        self.token, self.caps, self.min_new_tokens = zeros(rows), zeros(rows), zeros(1)
        self.uniform = zeros(rows, 1, dtype=torch.float32)
        self.alive = zeros(rows, dtype=torch.bool)
        self.tokens, self.log_probs = zeros(rows, capacity), zeros(rows, capacity, dtype=torch.float32)
        self.eos = zeros(0)
        self._mark_static()
        self.steps: dict = {}  # the runnable decoding step per (options, compile mode): `step_capture.py`
        self._weight_addresses = weight_addresses(model)

    def weights_moved(self, model: nn.Module) -> bool:
        """Whether a parameter or buffer of `model` is stored elsewhere than when the steps were built (a copy
        refreshed in place, an optimizer step keep their storage; moving the model, replacing a tensor do not)."""
        now = weight_addresses(model)
        moved, self._weight_addresses = now != self._weight_addresses, now
        return moved

    def _mark_static(self) -> None:
        """Tell `torch.compile` the buffers keep their addresses: `reduce-overhead` then replays its graph on them
        instead of copying them in at every step."""
        for tensor in (self.mask, self.positions, self.slot, self.step, self.token, self.caps, self.min_new_tokens):
            torch._dynamo.mark_static_address(tensor)
        for tensor in (self.uniform, self.alive, self.tokens, self.log_probs, self.eos):
            torch._dynamo.mark_static_address(tensor)

    def fits(self, rows: int, length: int, key_like: Tensor, value_like: Tensor) -> bool:
        """Whether a generation of `rows` rows and `length` positions, whose prefill's cache holds keys and values
        like `key_like` and `value_like`, can run here (autocast switched on or off changes the values' dtype)."""
        keys, values = self.cache.layers[0].keys, self.cache.layers[0].values
        same = keys.dtype == step_cache_dtype(key_like) and keys.device == key_like.device
        same = same and keys.shape[1] == key_like.shape[1]
        same = same and values.dtype == step_cache_dtype(value_like)
        return same and row_bucket(rows) == self.rows and length <= self.capacity

    def release(self) -> None:
        """Drop the decoding steps, which refer back to the workspace: its buffers are freed with the last reference
        to it, not at the garbage collector's next pass."""
        self.steps.clear()

    def load(self, cache, logits: Tensor, prompt_mask: Tensor, positions: Tensor, n: int) -> Tensor:
        """Step 0's state from a prefill of the distinct prompts (`prefill`): their keys and values copied `n` times
        into the static cache (rows `i*n .. i*n+n-1` of prompt `i`), the mask, positions and counters; the last
        logits of every row `[rows, V]` (rows past `B * n` are zero)."""
        batch, length = prompt_mask.shape
        used = batch * n
        for layer, source in zip(self.cache.layers, cache.layers, strict=True):
            for target, values in ((layer.keys, source.keys), (layer.values, source.values)):
                target[:used, :, :length].view(batch, n, *values.shape[1:]).copy_(values.unsqueeze(1))
            layer.cumulative_length.fill_(length)
        first = logits.new_zeros((self.rows, logits.shape[-1]))
        first[:used].view(batch, n, -1).copy_(logits.unsqueeze(1))
        self.mask.zero_()
        self.mask[:used, 0, 0, :length].view(batch, n, length).copy_(prompt_mask.bool().unsqueeze(1))
        self.positions.zero_()
        self.positions[:used].view(batch, n).copy_(positions[:, -1:] + 1)
        self.slot.fill_(length)
        self.step.zero_()
        return first

    def start(self, used: int, caps: Sequence[int], eos: Tensor, min_new_tokens: int) -> None:
        """Rows `0 .. used-1` decode, each at most `caps[row]` tokens; EOS ids `eos` (not before `min_new_tokens`)."""
        from rlvr_lightning.generation.loop import host_to_device

        self.alive.zero_()
        self.alive[:used] = True
        self.caps.fill_(self.capacity)
        self.caps[:used].copy_(host_to_device(list(caps), self.device, torch.long))
        if self.eos.shape != eos.shape:  # a new tokenizer's EOS ids: a new static buffer, and new steps to read it
            with torch.inference_mode(False):
                self.eos = eos.clone()
            torch._dynamo.mark_static_address(self.eos)
            self.steps.clear()
        self.eos.copy_(eos)
        self.min_new_tokens.fill_(min_new_tokens)


class WorkspacePool:
    """The workspaces of each model that samples (the policy's, a sampling copy's), one per row bucket, kept between
    generations so that their graphs are replayed rather than captured again; `clear` frees them."""

    def __init__(self) -> None:
        self._by_model: dict[int, tuple[weakref.ref, dict[int, DecodeWorkspace]]] = {}

    def get(self, model: nn.Module, rows: int, length: int, key_like: Tensor, value_like: Tensor) -> DecodeWorkspace:
        entry = self._by_model.get(id(model))
        if entry is None or entry[0]() is not model:
            self._by_model = {key: value for key, value in self._by_model.items() if value[0]() is not None}
            entry = (weakref.ref(model), {})
            self._by_model[id(model)] = entry
        workspaces = entry[1]
        found = workspaces.get(row_bucket(rows))
        if found is None or not found.fits(rows, length, key_like, value_like):
            if found is not None:  # free the old buffers before allocating the new ones
                workspaces.pop(found.rows).release()
            found = DecodeWorkspace(model, row_bucket(rows), capacity_for(length), key_like, value_like)
            workspaces[found.rows] = found
        return found

    def clear(self) -> None:
        for _, workspaces in self._by_model.values():
            for workspace in workspaces.values():
                workspace.release()
        self._by_model = {}


def step_cache_dtype(like: Tensor) -> torch.dtype:
    """The dtype the cache keeps keys or values in, for a prefill whose keys or values are like `like`: under autocast
    its dtype (values leave their projection in it; keys leave RoPE in float32, and every reader, SDPA or a matrix
    product, casts them to it anyway: cast once when written, the same rounding, instead of the whole cache at every
    layer of every step), else `like`'s (transformers < 5.20 gives a prefill's values its keys' dtype)."""
    device_type = like.device.type
    if torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return like.dtype


def _update_casting_keys(update, key_dtype: torch.dtype, key_states: Tensor, value_states: Tensor, *args, **kwargs):
    """A cache layer's `update` that writes the step's keys in the cache's key dtype (`step_cache_dtype`)."""
    return update(key_states.to(key_dtype), value_states, *args, **kwargs)

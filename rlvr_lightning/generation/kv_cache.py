"""Room for a `DynamicCache` to grow in place during decoding (`generation/loop.py`)."""

from __future__ import annotations

import functools

from torch import Tensor


def reserve_room(cache, capacity: int) -> None:
    """Plain (full-attention) layers of a `DynamicCache` append in place instead of `torch.cat`: each decoding
    step would otherwise re-allocate every layer's keys and values. Room doubles when full, up to `capacity`."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if isinstance(layers, list):
        cache.layers = [_growing_layer(capacity) if type(layer) is DynamicLayer else layer for layer in layers]


def _growing_layer(capacity: int):
    layer = _growing_layer_class()()
    layer.capacity = capacity
    return layer


@functools.cache
def _growing_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        capacity = 0
        length = 0
        key_room = value_room = None

        def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self.length + key_states.shape[-2]
            if self.key_room is None or end > self.key_room.shape[-2]:
                room = min(max(end, 2 * self.length, 64), max(self.capacity, end))
                self.key_room = self._grown(self.key_room, key_states, room)
                self.value_room = self._grown(self.value_room, value_states, room)
            self.key_room[..., self.length : end, :] = key_states
            self.value_room[..., self.length : end, :] = value_states
            self.length = end
            return self._views()

        def _grown(self, old: Tensor | None, new: Tensor, room: int) -> Tensor:
            grown = new.new_empty((*new.shape[:-2], room, new.shape[-1]))
            if old is not None:
                grown[..., : self.length, :] = old[..., : self.length, :]
            return grown

        def _views(self) -> tuple[Tensor, Tensor]:
            self.keys, self.values = self.key_room[..., : self.length, :], self.value_room[..., : self.length, :]
            return self.keys, self.values

        def batch_repeat_interleave(self, repeats: int) -> None:
            if self.key_room is not None:
                self.key_room = self.key_room.repeat_interleave(repeats, dim=0)
                self.value_room = self.value_room.repeat_interleave(repeats, dim=0)
                self._views()

        def batch_select_indices(self, indices: Tensor) -> None:
            if self.key_room is not None:
                self.key_room, self.value_room = self.key_room[indices], self.value_room[indices]
                self._views()

    return GrowingLayer


def cache_argument(model, cache) -> dict:
    """The KV cache as `model`'s forward takes it: `cache=` (transformers 5.2x renamed it; the old name warns at
    every call) or `past_key_values=` (older transformers, models of other libraries)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT model's own forward
    return {"cache" if _forward_takes_cache(type(base)) else "past_key_values": cache}


@functools.cache
def _forward_takes_cache(model_type: type) -> bool:
    import inspect

    try:
        return "cache" in inspect.signature(model_type.forward).parameters
    except (TypeError, ValueError, AttributeError):
        return False


def returned_cache(output):
    """The KV cache a forward returned, under either name, without touching the deprecated one."""
    if "cache" in getattr(output, "__dataclass_fields__", {}):
        return output.cache
    return getattr(output, "past_key_values", None)

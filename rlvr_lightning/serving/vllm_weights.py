"""What `VLLMGeneration` pushes to its engine, and when: the policy's weights under their checkpoint
names (`named_weights`), and a version of them that changes whenever they do (`parameter_version`)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn


def named_weights(
    model: nn.Module, dtype: torch.dtype | None = None, merge_lora: bool = True
) -> Iterator[tuple[str, Tensor]]:
    """The model's weights under their Hugging Face checkpoint names, one at a time, cast to `dtype` (None: as
    they are): LoRA adapters merged into copies of the base weights (the "default" adapter; the base weights
    are not touched), or with `merge_lora=False` the base weights alone, sharded tensors gathered. Only the
    tensor being yielded is held in full."""
    adapters: dict[str, nn.Module] = {}
    is_peft = hasattr(model, "get_base_model")
    if is_peft and merge_lora:
        from peft.tuners.lora import LoraLayer

        adapters = {
            f"{name}.base_layer.weight": module
            for name, module in model.named_modules()
            if isinstance(module, LoraLayer) and "default" in module.lora_A
        }
    for name, tensor in model.state_dict().items():
        if is_peft:
            if ".lora_" in name:
                continue
            if name in adapters:
                with torch.no_grad():
                    tensor = _full(tensor) + _full(adapters[name].get_delta_weight("default")).to(tensor.dtype)
            name = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
        tensor = _full(tensor).detach()
        yield name, tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor


def _full(tensor: Tensor) -> Tensor:
    """A sharded (DTensor) tensor gathered whole; any other tensor as is."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


_optimizer_steps = 0  # optimizer steps taken in this process (a global post-step hook counts them)
_step_hook = None


def count_optimizer_steps() -> None:
    """Install, once per process, the hook that counts optimizer steps (`parameter_version` reads the count)."""
    global _step_hook
    if _step_hook is None:

        def count(optimizer, args, kwargs) -> None:
            global _optimizer_steps
            _optimizer_steps += 1

        from torch.optim.optimizer import register_optimizer_step_post_hook

        _step_hook = register_optimizer_step_post_hook(count)


def tensor_versions(tensor: Tensor) -> tuple[int, int]:
    """A tensor's in-place modification counters: a sharded (DTensor) parameter's own counter moves when it is
    modified through the DTensor (its local shard's does not), its shard's when the shard is modified directly."""
    return tensor._version, getattr(tensor, "_local_tensor", tensor)._version


def parameter_version(model: nn.Module) -> tuple:
    """Changes whenever a parameter is modified: by an optimizer step (fused optimizers do not bump tensor
    version counters, so steps are counted), in place otherwise (load_state_dict), or replaced."""
    versions = tuple((id(p), *tensor_versions(p)) for p in model.parameters())
    return _optimizer_steps, versions

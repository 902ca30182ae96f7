"""A GPU's device rules on a CPU: tensors that compute on the CPU but say they are on another device.

CI has no GPU, and on a CPU every tensor is on the CPU, so a tensor made without naming a device (`torch.zeros(n)`
beside a rollout's `response_mask`) goes unnoticed until a GPU run fails on it. Under `emulated_device()` the
tensors moved or made on the meta device are `OnDevice` tensors: they report `meta` as their device, hold real CPU
values (so host reads, `.item()` and `.tolist()`, work and a whole training step runs), and every operator that
combines one with a CPU tensor CUDA would refuse (more than a 0-dim scalar, outside the copies and indexing that
cross devices) is recorded with the line of ours that ran it. `OntoEmulatedDevice` moves a training module there
once Lightning has placed it, and makes it build its tensors there (`runtime.devices.set_compute_device`). The
emulation holds in the thread that enters it (dispatch modes are per thread): not in background rollouts.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Iterator
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, return_and_correct_aliasing
from torch.utils._pytree import tree_leaves, tree_map

import rlvr_lightning
from rlvr_lightning.runtime.devices import set_compute_device

DEVICE = torch.device("meta")
CPU = torch.device("cpu")
OURS = str(Path(rlvr_lightning.__file__).parent) + os.sep
#: operators that take tensors on two devices on CUDA too (a copy across devices, a CPU index)
CROSSING = {"_to_copy", "to", "copy_", "index", "index_put_", "_index_put_impl_", "lift_fresh"}
#: Python-level factories that make a tensor on a device without an operator a dispatch mode sees
FACTORIES = (torch.tensor, torch.as_tensor, torch.asarray, torch.Tensor.new_tensor)


class OnDevice(torch.Tensor):
    """A CPU tensor `elem` that says it is on `DEVICE`."""

    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(
            cls,
            elem.shape,
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=DEVICE,
            requires_grad=elem.requires_grad,
        )

    def __init__(self, elem: torch.Tensor) -> None:
        self.elem = elem

    def __repr__(self) -> str:
        return f"OnDevice({self.elem!r})"

    def __tensor_flatten__(self):
        return ["elem"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return OnDevice(inner["elem"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"an OnDevice tensor reached {func} outside emulated_device()")

    def tolist(self):
        return self.elem.tolist()


def _unwrap(value):
    return value.elem if isinstance(value, OnDevice) else value


def _to_cpu(value):
    return CPU if isinstance(value, torch.device) else value


def _caller() -> str:
    frames = [frame for frame in traceback.extract_stack() if frame.filename.startswith(OURS)]
    return f"{frames[-1].filename[len(OURS) :]}:{frames[-1].lineno}" if frames else "outside rlvr_lightning"


class EmulatedDevice(TorchDispatchMode):
    """Runs every operator on the CPU values; outputs of an operator given an `OnDevice` tensor or asked for the
    device are `OnDevice`; `mixed` lists the operators that combined one with a CPU tensor CUDA refuses."""

    def __init__(self) -> None:
        super().__init__()
        self.mixed: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.__name__.split(".")[0]
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        on_device = any(isinstance(t, OnDevice) for t in tensors)
        if on_device and name not in CROSSING and any(not isinstance(t, OnDevice) and t.dim() > 0 for t in tensors):
            self.mixed.append(f"{func} at {_caller()}")
        devices = [d for d in tree_leaves((args, kwargs)) if isinstance(d, torch.device)]
        to_device = any(d.type == DEVICE.type for d in devices)
        to_host = any(d.type == "cpu" for d in devices)  # asked for the CPU by name: `.cpu()`, `new_zeros(device=)`
        out = func(*tree_map(_unwrap, tree_map(_to_cpu, args)), **tree_map(_unwrap, tree_map(_to_cpu, kwargs)))
        if name == "_local_scalar_dense" or to_host or not (on_device or to_device):
            return out
        wrapped = tree_map(lambda t: OnDevice(t) if type(t) is torch.Tensor else t, out)
        if not on_device:  # made on the device from host values: nothing of the inputs' to alias
            return wrapped
        return return_and_correct_aliasing(func, args, kwargs, wrapped)


class EmulatedFactories(TorchFunctionMode):
    """`torch.tensor(data, device=DEVICE)` and kin: made on the CPU, then `OnDevice`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if func is torch.Tensor.new_tensor and device is None and isinstance(args[0], OnDevice):
            device = DEVICE  # a new tensor on `self`'s device
        if func in FACTORIES and device is not None and torch.device(device).type == DEVICE.type:
            args = tree_map(_unwrap, args)  # `new_tensor`'s `self`
            return OnDevice(func(*args, **{**kwargs, "device": CPU}))
        return func(*args, **kwargs)


class _Generator(torch.Generator):
    """`torch.Generator(device=DEVICE)` draws on the CPU (the meta device has no generator)."""

    def __new__(cls, device="cpu"):
        return super().__new__(cls, device=CPU if torch.device(device).type == DEVICE.type else device)


def _autocast(autocast):
    def on(device_type, *args, **kwargs):
        if device_type == DEVICE.type:  # the meta device has no autocast: run as the CPU without it
            return contextlib.nullcontext()
        return autocast(device_type, *args, **kwargs)

    return on


@contextlib.contextmanager
def emulated_device() -> Iterator[EmulatedDevice]:
    """Within the block, the emulation (the module's docstring); yields the mode whose `mixed` lists the mixes."""
    saved = torch.autocast, torch.Generator, torch.Tensor.pin_memory
    torch.autocast, torch.Generator = _autocast(torch.autocast), _Generator
    torch.Tensor.pin_memory = lambda tensor, *args, **kwargs: tensor
    try:
        with EmulatedFactories(), EmulatedDevice() as mode:
            yield mode
    finally:
        torch.autocast, torch.Generator, torch.Tensor.pin_memory = saved


def move_onto_emulated_device(module: torch.nn.Module) -> None:
    """Every parameter and buffer of `module` becomes `OnDevice`, the parameters in place (the same Python objects,
    so an optimizer built on them keeps them; tied parameters stay tied). Inside `emulated_device()`."""
    for submodule in module.modules():
        for parameter in submodule._parameters.values():
            if parameter is not None and not isinstance(parameter, OnDevice):
                moved = OnDevice(parameter.detach().clone())
                torch.utils.swap_tensors(parameter, torch.nn.Parameter(moved, requires_grad=parameter.requires_grad))
        for name, buffer in submodule._buffers.items():
            if buffer is not None and not isinstance(buffer, OnDevice):
                submodule._buffers[name] = OnDevice(buffer.clone())


def held_outside_the_tree(pl_module) -> list[torch.nn.Module]:
    """The frozen models a training module holds outside its module tree, which its `configure_model` placed on the
    strategy's device (a distillation teacher, a self-teacher's copy): models among its attributes or theirs."""
    found = []
    for value in vars(pl_module).values():
        if isinstance(value, pl.Trainer):
            continue
        values = [value] if isinstance(value, torch.nn.Module) else list(getattr(value, "__dict__", {}).values())
        found += [model for model in values if isinstance(model, torch.nn.Module)]
    return found


class OntoEmulatedDevice(pl.Callback):
    """Once the strategy has placed the module (on the CPU): its weights onto the emulated device, where it computes
    and builds its tensors from then on, as it would on a GPU."""

    def on_fit_start(self, trainer, pl_module) -> None:
        for module in (pl_module, *held_outside_the_tree(pl_module)):
            move_onto_emulated_device(module)
            set_compute_device(module, DEVICE)
        pl_module._device = DEVICE
        for optimizer in trainer.optimizers:  # fused kernels refuse the meta device: the for-loop ones
            for group in optimizer.param_groups:
                group.update({key: False for key in ("fused", "foreach") if group.get(key)})

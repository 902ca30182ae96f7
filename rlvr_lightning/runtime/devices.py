"""Where a module computes: the device tensors for its forward are built on."""

from __future__ import annotations

import torch
from torch import nn


def compute_device(module: nn.Module) -> torch.device:
    """The device `module` computes on: the one `set_compute_device` recorded (a training module records its
    strategy's root device), else its first parameter's (CPU without parameters).

    The two differ under FSDP2 with CPU offload: the sharded parameters stay in CPU memory while every
    forward runs on the GPU, so tensors built for a forward must not follow the parameters."""
    device = getattr(module, "_compute_device", None)
    if device is not None:
        return device
    first = next(module.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def set_compute_device(module: nn.Module, device: torch.device) -> None:
    """Record `device` as where `module` and every submodule compute (`compute_device` reads it)."""
    for submodule in module.modules():
        submodule._compute_device = torch.device(device)

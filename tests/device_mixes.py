"""A stand-in for a GPU on a CPU: run the code with its model and inputs on the meta device, where an operator given
a tensor left on the CPU raises, and under `MixedDevices`, which also finds the mixes CUDA refuses and the meta
device lets through (a 1-element CPU tensor in an in-place operator)."""

from __future__ import annotations

import os
import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import rlvr_lightning

OURS = str(Path(rlvr_lightning.__file__).parent) + os.sep


class MixedDevices(TorchDispatchMode):
    """Each operator given tensors on two devices where CUDA's rule refuses it (a 0-dim CPU tensor is a scalar; a
    copy moves, an index may be on the CPU), with the line of ours that called it."""

    CROSSING = {"_to_copy", "copy_", "index", "index_put_", "_index_put_impl_"}

    def __init__(self) -> None:
        super().__init__()
        self.mixed: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tensors = [t for t in tree_leaves((args, kwargs or {})) if isinstance(t, torch.Tensor)]
        devices = {t.device for t in tensors if t.device.type != "cpu" or t.dim() > 0}
        if len(devices) > 1 and func.__name__.split(".")[0] not in self.CROSSING:
            frames = [f for f in traceback.extract_stack() if f.filename.startswith(OURS)]
            self.mixed.append(f"{func} at {frames[-1].filename}:{frames[-1].lineno}" if frames else str(func))
        return func(*args, **(kwargs or {}))

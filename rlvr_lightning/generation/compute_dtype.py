"""The dtype a model computes in during training, which may differ from the dtype its weights are stored in:
FSDP2's mixed precision gathers fp32 master weights in `param_dtype`, and autocast (Lightning's `bf16-mixed`,
entered around each step) runs matrix products in its dtype over fp32 weights."""

from __future__ import annotations

import torch
from torch import nn


def compute_dtype(model: nn.Module) -> torch.dtype:
    """FSDP2's `param_dtype` if the model is sharded with one, else the calling thread's autocast dtype for the
    weights' device if autocast is on, else the weights' dtype."""
    weights = next(model.parameters())
    sharded = fsdp_param_dtype(model)
    if sharded is not None:
        return sharded
    device_type = weights.device.type
    try:
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
    except RuntimeError:  # a device type autocast does not know (meta)
        pass
    return weights.dtype


def fsdp_param_dtype(model: nn.Module) -> torch.dtype | None:
    """The `MixedPrecisionPolicy.param_dtype` of the first FSDP2 unit in `model`; None when unsharded or unset."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    for module in model.modules():
        if isinstance(module, FSDPModule):
            policy = getattr(fully_shard.state(module), "_mp_policy", None)
            return getattr(policy, "param_dtype", None)
    return None

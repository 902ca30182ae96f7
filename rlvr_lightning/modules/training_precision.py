"""Refuse training precisions that lose the update: weights the optimizer steps in bf16/fp16, and fp16's loss
scaling under manual optimisation; clip a fused optimizer's gradients under bf16-mixed, which Lightning refuses.

bf16 keeps 8 significant bits: an update smaller than about 1/256 of a weight rounds away. AdamW's update is
about `lr` per weight, so at RL learning rates (1e-6) almost no bf16 weight moves; mixed-precision training
keeps fp32 master weights for that reason (Micikevicius et al. 2018, "Mixed precision training", sec. 3.1).
Here that is `trainer.precision: bf16-mixed` over fp32 weights, or FSDP2's `param_dtype: bfloat16` over
fp32 shards; LoRA adapters are fp32 over a bf16 base (peft's default).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch

LOW_PRECISION = (torch.bfloat16, torch.float16)


def check_training_precision(module) -> None:
    """Raise when fit would step bf16/fp16 weights, or scale an fp16 loss under manual optimisation (called by
    `PolicyModule.on_fit_start`, after Lightning's precision plugin converted the weights and the strategy
    sharded them)."""
    precision = str(module.trainer.precision)
    if precision.startswith("16") and precision.endswith("mixed") and not module.automatic_optimization:
        raise ValueError(
            f"trainer.precision={precision!r} is not supported by {type(module).__name__}: fp16 needs a loss scaler, "
            "and this module steps its optimizer itself (manual optimisation), so gradients would be clipped while "
            "still scaled and a skipped non-finite step would never lower the scale. Use trainer.precision: "
            "bf16-mixed (no scaling needed), or 32-true"
        )
    low = [(name, p.dtype) for name, p in module.named_parameters() if p.requires_grad and p.dtype in LOW_PRECISION]
    if not low:
        return
    dtype = low[0][1]
    names = ", ".join(name for name, _ in low[:3]) + (f", ... ({len(low)} in all)" if len(low) > 3 else "")
    if precision.endswith("-true") and not precision.startswith(("32", "64")):
        cause = f"trainer.precision={precision!r} converts every weight to {dtype}"
        fix = "train with trainer.precision: bf16-mixed over fp32 weights"
    else:
        cause = (
            f"the policy's weights are loaded in {dtype} (its model.dtype option) and "
            f"trainer.precision={precision!r} keeps them so"
        )
        fix = "load the policy with model.dtype: float32 and train with trainer.precision: bf16-mixed"
    raise ValueError(
        f"{cause}: the optimizer would update {dtype} weights in place ({names}), and an update smaller than "
        f"1/256 of a weight is rounded away (at lr 1e-6 almost none moves). Keep fp32 master weights: {fix}, or "
        "shard with FSDP2Strategy(param_dtype: bfloat16) over fp32 weights; or train a LoRA adapter (lora.r > 0), "
        "whose weights stay fp32 over a bf16 base"
    )


@contextlib.contextmanager
def clipping_without_a_scaler(plugin) -> Iterator[None]:
    """Within the block, a Lightning `MixedPrecision` plugin without a loss scaler (bf16) clips gradients as the
    plain `Precision` does. Lightning refuses to clip for a fused optimizer under every `MixedPrecision`, because a
    fused step unscales fp16's scaled gradients itself; bf16 scales nothing, so there is nothing to refuse."""
    from lightning.pytorch.plugins.precision import MixedPrecision, Precision

    if not isinstance(plugin, MixedPrecision) or plugin.scaler is not None:
        yield
        return
    plugin.clip_gradients = functools.partial(Precision.clip_gradients, plugin)  # shadows the class's method
    try:
        yield
    finally:
        del plugin.clip_gradients

"""Lean activations: a decoder's RMSNorm and SwiGLU layers keep fewer tensors for the backward pass.

Autograd keeps every intermediate its backward formulas read. Two of a Llama-family layer's are cheap to
recompute from tensors that are kept anyway:

* RMSNorm keeps its normalised input `x * rstd` (one hidden-size vector per token, twice per layer); here it
  keeps `x` (which the residual stream holds anyway) and the per-token `rstd`, and recomputes `x * rstd`.
* SwiGLU keeps `silu(gate)` (one intermediate-size vector per token) beside `gate` and `up`; here it keeps `gate`
  and `up` alone and recomputes `silu(gate)` (Liger-Kernel's `LigerSiLUMulFunction` does the same on GPUs).

On SmolLM2-135M that is 10.75 KB per token and layer of about 43 KB kept by transformers' layers; the step's
peak memory falls by 0.31 GB (`scripts/bench_step.py`, the `plain` leg is without; docs/benchmarks.md).
The forward values are bitwise those of the transformers layers (the same operations in the same order), and the
gradients equal theirs to float rounding (`tests/policies/test_lean_layers.py`). On a CUDA device the norm is torch's
fused `F.rms_norm` instead (`fused_norm_applies`: fewer kernel launches; values and gradients equal to rounding).
Without autograd (sampling, scoring under `no_grad`) the layers run transformers' own code. Applied to the layers
whose transformers code these formulas are written against (`LEAN_NORMS`, `LEAN_MLPS` with a SiLU activation); others
are left as they are.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

LEAN_NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm")
LEAN_MLPS = ("LlamaMLP", "Qwen2MLP", "Qwen3MLP", "MistralMLP")


class RMSNormFunction(torch.autograd.Function):
    """`weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)`, as transformers' `LlamaRMSNorm`, keeping x and rstd."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        x32 = x.to(torch.promote_types(x.dtype, torch.float32))  # transformers: fp32 (float64 kept for gradcheck)
        rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return weight * (x32 * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight, rstd = ctx.saved_tensors
        normed = x.to(rstd.dtype) * rstd
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = (grad * normed.to(x.dtype)).reshape(-1, weight.shape[-1]).sum(0).to(weight.dtype)
        grad_normed = (grad * weight).to(rstd.dtype)
        # d(x * rstd)/dx: rstd * (g - xn * mean(g * xn)), with rstd = (mean(x^2) + eps)^-1/2 (Zhang & Sennrich 2019)
        grad_x = rstd * (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight, None


class SiluMulFunction(torch.autograd.Function):
    """`silu(gate) * up`, keeping gate and up (silu(gate) is recomputed in the backward)."""

    @staticmethod
    def forward(ctx, gate: Tensor, up: Tensor) -> Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad: Tensor):
        gate, up = ctx.saved_tensors
        # silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g))), in autograd's own kernel for silu
        grad_gate = torch.ops.aten.silu_backward(grad * up, gate)
        return grad_gate, grad * F.silu(gate)


def fused_norm_applies(x: Tensor, weight: Tensor) -> bool:
    """On a CUDA device torch's `F.rms_norm` runs one fused kernel each way (`_fused_rms_norm`, torch >= 2.9), where
    the formulas above launch 6 forward and 9 backward kernels; its autograd keeps x and rstd too. It fuses
    only where x and the weight share a dtype (else it decomposes into the unfused operations)."""
    return x.device.type == "cuda" and x.dtype == weight.dtype


def _lean_norm_forward(self, hidden_states: Tensor) -> Tensor:
    if torch.is_grad_enabled() and (hidden_states.requires_grad or self.weight.requires_grad):
        if fused_norm_applies(hidden_states, self.weight):
            return F.rms_norm(hidden_states, self.weight.shape, self.weight, self.variance_epsilon)
        return RMSNormFunction.apply(hidden_states, self.weight, self.variance_epsilon)
    return type(self).forward(self, hidden_states)


def _lean_mlp_forward(self, x: Tensor) -> Tensor:
    gate, up = self.gate_proj(x), self.up_proj(x)
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        return self.down_proj(SiluMulFunction.apply(gate, up))
    return self.down_proj(self.act_fn(gate) * up)


def apply_lean_layers(model: nn.Module) -> int:
    """Give the model's RMSNorm and SwiGLU layers the lean forwards (in place, per module); how many were changed."""
    changed = 0
    for module in model.modules():
        name = type(module).__name__
        if name in LEAN_NORMS and hasattr(module, "variance_epsilon"):
            module.forward = functools.partial(_lean_norm_forward, module)  # a partial pickles and deep-copies
            changed += 1
        elif name in LEAN_MLPS and type(getattr(module, "act_fn", None)).__name__ in ("SiLU", "SiLUActivation"):
            module.forward = functools.partial(_lean_mlp_forward, module)
            changed += 1
    return changed


def remove_lean_layers(model: nn.Module) -> int:
    """Give the modules of `model` that `apply_lean_layers` changed their class's forward back; how many."""
    changed = 0
    for module in model.modules():
        forward = module.__dict__.get("forward")
        if isinstance(forward, functools.partial) and forward.func in (_lean_norm_forward, _lean_mlp_forward):
            del module.forward
            changed += 1
    return changed

"""The precision our generation loop samples in (`KVCacheGeneration(dtype=...)`), independent of the fp32 master
weights the trainer updates.

`SamplingWeights` keeps a copy of a model whose parameters are cast to the sampling dtype, refreshed before a
generation whenever a parameter of the model changed (an optimizer step, `load_state_dict`, a LoRA adapter
swap). The model itself is never touched. Buffers stay as they are (rotary frequencies keep fp32 precision).

Why a copy and not `torch.autocast`: decoding is bound by reading the weights, once per decoding step. Autocast
casts every fp32 weight to bf16 at every matrix product (reads 4 bytes and writes 2 per weight, then reads the 2),
while the copy reads 2 bytes per weight per step and casts once per update. Measured on SmolLM2-135M
(`scripts/bench_sampling_precision.py`, docs/benchmarks.md), the copy took 17% less CPU time than autocast; on a CPU
without bf16 arithmetic (AVX2) both were ~3x slower than fp32, so `auto` (the default) stays fp32 there. The copy
costs the model's size in the sampling dtype (SmolLM2-135M: 270 MB; built in 3.7 s, refreshed in 1.1 s on a
loaded 2-core machine).
"""

from __future__ import annotations

import copy
import functools
import weakref
from typing import Literal

import torch
from torch import nn

from rlvr_lightning.core.float32_head import Float32Head
from rlvr_lightning.generation.compute_dtype import compute_dtype, fsdp_param_dtype
from rlvr_lightning.serving.vllm_weights import count_optimizer_steps, parameter_version

SAMPLING_DTYPES = ("float32", "bfloat16", "auto")
SamplingDtype = Literal["float32", "bfloat16", "auto"]


def check_sampling_dtype(option: str, value: str) -> None:
    """A clear error for a sampling dtype that is not one of `SAMPLING_DTYPES`."""
    if value not in SAMPLING_DTYPES:
        raise ValueError(f"{option}={value!r} is not valid; choose one of {list(SAMPLING_DTYPES)}")


def resolve_sampling_dtype(dtype: str, model: nn.Module) -> torch.dtype:
    """`float32` / `bfloat16` as named; `auto`: the dtype the trainer computes in (`compute_dtype`: FSDP2's
    `param_dtype`, `bf16-mixed`'s autocast dtype, else the weights'), as `VLLMGeneration(dtype="auto")`."""
    if dtype == "auto":
        return compute_dtype(model)
    return getattr(torch, dtype)


class SamplingWeights:
    """The model to sample from in `dtype`: the model itself when it already computes in `dtype`, else a cast copy
    kept up to date with it (one per model; the copy is not a submodule of anything, so it is neither trained
    nor checkpointed)."""

    def __init__(self) -> None:
        # id(model) -> (weak reference to the model, its copy, the version copied): the policy's (first rollout,
        # top-ups, validation) and, with asynchronous rollouts, the sampling copy's
        self._copies: dict[int, tuple[weakref.ref, nn.Module, tuple]] = {}
        count_optimizer_steps()

    def model_for(self, model: nn.Module, dtype: torch.dtype) -> nn.Module:
        """`model` when its forward already computes in `dtype`, else the refreshed cast copy."""
        if compute_dtype(model) == dtype:
            return model
        if fsdp_param_dtype(model) is not None or any(hasattr(p, "_local_tensor") for p in model.parameters()):
            raise ValueError(
                f"KVCacheGeneration(dtype={str(dtype).removeprefix('torch.')!r}) cannot copy a sharded model; "
                "set FSDP2's mixed-precision param_dtype to the sampling dtype (then the model samples as it is) "
                "or use dtype: auto"
            )
        version = parameter_version(model)
        entry = self._copies.get(id(model))
        if entry is not None and entry[0]() is model:
            _, cast, seen = entry
            if seen != version:
                _refresh(model, cast, seen[1], version[1])
        else:
            self._copies = {key: value for key, value in self._copies.items() if value[0]() is not None}
            cast = _cast_copy(model, dtype)
        self._copies[id(model)] = (weakref.ref(model), cast, version)
        return cast

    def __getstate__(self) -> dict:
        return {"_copies": {}}  # a copy never travels (deepcopy, pickling): it is rebuilt on first use

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        count_optimizer_steps()


def _cast_copy(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A frozen copy of `model` in eval mode whose floating-point parameters are `dtype` (buffers as they are), but
    for a float32 output layer's (`core/float32_head.py`), which stay float32. Never inference tensors
    (`trainer.validate` runs in `torch.inference_mode`): the copy is refreshed in place outside it."""
    with torch.no_grad(), torch.inference_mode(False):
        params = {id(p): p for p in model.parameters()}
        # share nothing with the model, but do not copy the parameters twice: each copy is built by the cast
        memo = {id_: nn.Parameter(torch.empty(0, device=p.device), requires_grad=False) for id_, p in params.items()}
        cast = copy.deepcopy(model, memo)
        head = {id(p) for m in model.modules() if isinstance(m, Float32Head) for p in m.parameters()}
        for (_, target), source in zip(cast.named_parameters(), model.parameters(), strict=True):
            to = torch.float32 if id(source) in head else dtype if source.is_floating_point() else source.dtype
            target.data = source.detach().to(to, copy=True)
        _embed_in(cast, dtype)
    cast.requires_grad_(False)
    cast.eval()
    return cast


def _embed_in(cast: nn.Module, dtype: torch.dtype) -> None:
    """An embedding of `cast` that shares its float32 weight with a float32 output layer (tied) returns `dtype`
    vectors, as the embedding of a `dtype` weight (the same rounding), to the rest of the cast model (TRL's
    `cast_lm_head_to_fp32` hook)."""
    weights = {id(m.weight) for m in cast.modules() if isinstance(m, Float32Head)}
    for module in cast.modules():
        if isinstance(module, nn.Embedding) and id(module.weight) in weights:
            module.register_forward_hook(functools.partial(_output_to, dtype=dtype))


def _output_to(module: nn.Module, inputs: tuple, output: torch.Tensor, *, dtype: torch.dtype) -> torch.Tensor:
    return output.to(dtype)


@torch.no_grad()
def _refresh(model: nn.Module, cast: nn.Module, seen: tuple, now: tuple) -> None:
    """Copy (and cast) into `cast` every parameter of `model` that may have changed: the trainable ones (an
    optimizer step leaves no trace on them) and any other whose version moved (a frozen LoRA base stays)."""
    for target, source, before, after in zip(cast.parameters(), model.parameters(), seen, now, strict=True):
        if source.requires_grad or before != after:
            target.copy_(source.detach())

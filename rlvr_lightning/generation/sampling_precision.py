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

import contextlib
import copy
import functools
import weakref
from typing import Literal, NamedTuple

import torch
from torch import Tensor, nn

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


class _Copy(NamedTuple):
    model: weakref.ref
    sampler: nn.Module
    sources: list[int]  # for each tensor the copy holds, the index of its source in `model.parameters()`
    targets: list[Tensor]
    version: tuple  # `parameter_version(model)` when the copy was last refreshed


class SamplingWeights:
    """The model to sample from in `dtype`: the model itself when it already computes in `dtype` from weights of
    that dtype, else a copy kept up to date with it (one per model and kind; a copy is not a submodule of anything,
    so it is neither trained nor checkpointed):

    * a cast copy (`dtype` differs from what the model computes in): every floating-point parameter in `dtype`,
      run with autocast off;
    * an autocast copy (autocast to `dtype` is on, as under `bf16-mixed`, and the weights are another dtype): the
      weights and biases of the plain linear layers in `dtype`, every other parameter shared with the model, run
      under the caller's autocast. It computes exactly what the model computes there (autocast casts a linear
      layer's operands to `dtype` anyway, rounding as `.to(dtype)` does), but a decoding step reads 2 bytes a weight
      instead of casting each fp32 weight again (4 bytes read, 2 written, 2 read)."""

    def __init__(self) -> None:
        # (id(model), autocast copy?) -> the copy: the policy's (first rollout, top-ups, validation) and, with
        # asynchronous rollouts, the sampling copy's
        self._copies: dict[tuple[int, bool], _Copy] = {}
        count_optimizer_steps()

    def model_for(self, model: nn.Module, dtype: torch.dtype) -> nn.Module:
        """`model` when it already computes in `dtype` from weights it needs no cast of, else the refreshed copy."""
        under_autocast = compute_dtype(model) == dtype
        if under_autocast and not _autocast_casts_weights(model, dtype):
            return model
        if fsdp_param_dtype(model) is not None or any(hasattr(p, "_local_tensor") for p in model.parameters()):
            if under_autocast:
                return model  # a sharded model's linear weights cannot be copied: autocast casts them
            raise ValueError(
                f"KVCacheGeneration(dtype={str(dtype).removeprefix('torch.')!r}) cannot copy a sharded model; "
                "set FSDP2's mixed-precision param_dtype to the sampling dtype (then the model samples as it is) "
                "or use dtype: auto"
            )
        key, version = (id(model), under_autocast), parameter_version(model)
        entry = self._copies.get(key)
        if entry is not None and entry.model() is model and _same_parameters(entry.version, version):
            if entry.version != version:
                _refresh(model, entry, version)
        else:  # new, or a parameter was replaced (a copy that shares it would miss it): built anew
            self._copies = {k: v for k, v in self._copies.items() if v.model() is not None and k != key}
            build = _autocast_copy if under_autocast else _cast_copy
            sampler, sources, targets = build(model, dtype)
            entry = _Copy(weakref.ref(model), sampler, sources, targets, version)
        self._copies[key] = entry._replace(version=version)
        return entry.sampler

    def precision(self, model: nn.Module, sampler: nn.Module, device_type: str) -> contextlib.AbstractContextManager:
        """What to sample from `sampler` (`model_for(model, ...)`) on `device_type` under: the caller's autocast for
        the model itself and its autocast copy, autocast off for a cast copy (which computes in its own dtype:
        autocast would cast it again)."""
        autocast_copy = self._copies.get((id(model), True))
        if sampler is model or (autocast_copy is not None and autocast_copy.sampler is sampler):
            return contextlib.nullcontext()
        return torch.autocast(device_type, enabled=False)

    def __getstate__(self) -> dict:
        return {"_copies": {}}  # a copy never travels (deepcopy, pickling): it is rebuilt on first use

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        count_optimizer_steps()


def _plain_linear_layers(model: nn.Module) -> list[nn.Linear]:
    """The layers autocast runs as `F.linear` of their own parameters (not a `Float32Head`, which computes in fp32,
    nor another subclass)."""
    return [m for m in model.modules() if type(m) is nn.Linear]


def _autocast_casts_weights(model: nn.Module, dtype: torch.dtype) -> bool:
    try:
        if not torch.is_autocast_enabled(next(model.parameters()).device.type):
            return False
    except RuntimeError:  # a device type autocast does not know (meta)
        return False
    return any(
        p is not None and p.is_floating_point() and p.dtype != dtype
        for m in _plain_linear_layers(model)
        for p in (m.weight, m.bias)
    )


def _same_parameters(seen: tuple, now: tuple) -> bool:
    """Whether the model holds the same parameter objects (its version's ids) as when the copy was built."""
    return [v[0] for v in seen[1]] == [v[0] for v in now[1]]


def _autocast_copy(model: nn.Module, dtype: torch.dtype) -> tuple[nn.Module, list[int], list[Tensor]]:
    """`model` with the parameters of its plain linear layers cast to `dtype` (a tied output layer gets its own
    cast weight; the embedding keeps the model's) and every other parameter shared with it, in eval mode."""
    with torch.no_grad(), torch.inference_mode(False):
        params = list(model.parameters())
        index = {id(p): i for i, p in enumerate(params)}
        sampler = copy.deepcopy(model, {id(p): p for p in params})  # the modules copied, the parameters shared
        sources, targets, cast = [], [], {}
        for module in _plain_linear_layers(sampler):
            for name in ("weight", "bias"):
                source = getattr(module, name)
                if source is None or not source.is_floating_point() or source.dtype == dtype:
                    continue
                if id(source) not in cast:
                    cast[id(source)] = nn.Parameter(source.detach().to(dtype, copy=True), requires_grad=False)
                    sources.append(index[id(source)])
                    targets.append(cast[id(source)])
                setattr(module, name, cast[id(source)])
    sampler.eval()
    return sampler, sources, targets


def _cast_copy(model: nn.Module, dtype: torch.dtype) -> tuple[nn.Module, list[int], list[Tensor]]:
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
    targets = list(cast.parameters())
    return cast, list(range(len(targets))), targets


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
def _refresh(model: nn.Module, copy_: _Copy, now: tuple) -> None:
    """Copy (and cast) into the copy every parameter of `model` it holds that may have changed: the trainable ones
    (an optimizer step leaves no trace on them) and any other whose version moved (a frozen LoRA base stays)."""
    params, seen = list(model.parameters()), copy_.version[1]
    for index, target in zip(copy_.sources, copy_.targets, strict=True):
        source = params[index]
        if source.requires_grad or seen[index] != now[1][index]:
            target.copy_(source.detach())

"""Scoring through compiled decoder layers: `HFPolicy(model=HFModelOptions(compile_layers=...))`.

`torch.compile` fuses a decoder layer's small operators (RMSNorm, rotary embeddings, SwiGLU, the residual adds)
into fewer kernels, in the forward and in the backward. That pays where a layer is bound by kernel launches and
memory traffic (a small model on a GPU), not where its matrix products dominate (a CPU: SmolLM2-135M's forward
and backward of 8 rows took 0.97x the time padded and 1.02x packed, docs/benchmarks.md), so it is an option:

* `auto` (default): `default` where the forward's hidden states are on a CUDA device and the layer is not sharded
  by FSDP2, `none` elsewhere. On a CUDA device it first drops the layer's lean forwards (`lean_layers.py`), which
  would cost a graph per layer; where inductor fails to compile, it warns and runs the layers uncompiled from then
  on. At SmolLM2-135M's shape on an H200 (bf16 autocast, 8 x 8 x 128 tokens, 2026-12-04, `bash
  scripts/gpu_check.sh bench` with `BENCH_LEGS='ours compiled trl'`) compiled layers took a step's scoring forward
  and backward from 0.503 s (lean activations) to 0.375 s, TRL's 0.481 s;
* `none`: the layers run as transformers wrote them;
* `default`: each layer's forward through `torch.compile` (inductor);
* `aot_eager`: traced by the compiler but run by torch's own operators (checks on any machine that the layers
  trace; no faster).

One compiled function serves every layer of a class: the compiler treats a layer's parameters as inputs
(`inline_inbuilt_nn_modules`), so the 30 layers of SmolLM2 share one graph per input shape and mask kind, and
sequence lengths become dynamic after the first change. Only forwards without a key/value cache run compiled:
scoring's joint and packed forwards. Sampling and prefix-shared scoring pass a cache, whose per-layer index would
specialise a graph per layer, so those run the layer as written (a compiled decoding step traces through it
as before).

Lean activations' per-module forwards (`lean_layers.py`) are not given to compiled layers: the compiler guards a
module's own forward by its identity, which would compile one graph per layer; inductor's partitioner recomputes
cheap pointwise results in the backward by itself. The output layer's lean log-probs stay.

The compiled forward is installed per layer as `functools.partial(_layer_forward, layer, mode)`, like lean
activations' forwards: a deep copy (the KL reference) gets a partial bound to its own layers, and the compiled
function itself is looked up per class, never stored on a layer.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from rlvr_lightning.policies.lean_layers import apply_lean_layers, remove_lean_layers
from rlvr_lightning.runtime.recompile_limit import raise_recompile_limit

#: the values of `HFModelOptions.compile_layers`
COMPILE_LAYERS = ("auto", "none", "default", "aot_eager")
# one graph per (input shapes static or dynamic, mask kind, grad mode, autocast, attention kernel): more than
# dynamo's default of 8 across a run's scoring calls
RECOMPILE_LIMIT = 64


@functools.cache
def compiled_forward(forward: Callable[..., Any], mode: str) -> Callable[..., Any]:
    """`forward` (a decoder layer class's) through `torch.compile` in `mode`, one per (function, mode)."""
    raise_recompile_limit(RECOMPILE_LIMIT)
    backend = "aot_eager" if mode == "aot_eager" else "inductor"
    return torch.compile(forward, backend=backend)


#: the layer classes whose compilation failed under `auto` (they run uncompiled from then on)
_FAILED: set[type] = set()


def _layer_forward(layer: nn.Module, mode: str, *args: Any, **kwargs: Any) -> Any:
    forward = type(layer).forward
    if kwargs.get("past_key_values") is not None or kwargs.get("use_cache"):
        return forward(layer, *args, **kwargs)
    if mode == "auto":
        return _auto_forward(layer, *args, **kwargs)
    return compiled_forward(forward, mode)(layer, *args, **kwargs)


def _auto_forward(layer: nn.Module, *args: Any, **kwargs: Any) -> Any:
    forward = type(layer).forward
    hidden = args[0] if args else kwargs.get("hidden_states")
    if not auto_compiles(layer, hidden):
        return forward(layer, *args, **kwargs)
    lean = 0
    if not layer.__dict__.get(LEAN_DROPPED):  # once per layer: not on every forward
        lean, layer.__dict__[LEAN_DROPPED] = remove_lean_layers(layer), True
    try:
        return compiled_forward(forward, AUTO_MODE)(layer, *args, **kwargs)
    except torch._dynamo.exc.TorchDynamoException as error:  # inductor's failures reach here as BackendCompilerFailed
        _FAILED.add(type(layer))
        if lean:  # layers compiled before keep transformers' forwards: the same values
            apply_lean_layers(layer)
        error = getattr(error, "inner_exception", None) or error  # the compiler's own error
        warnings.warn(
            f"model.compile_layers='auto': compiling {type(layer).__name__} failed, so the decoder layers run "
            f"uncompiled from now on (compile_layers: none chooses that without trying). The error: "
            f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}",
            stacklevel=2,
        )
        return forward(layer, *args, **kwargs)


#: what `auto` compiles with where it compiles
AUTO_MODE = "default"
#: the flag `auto` leaves on a layer whose lean forwards it dropped
LEAN_DROPPED = "_lean_forwards_dropped"


def auto_compiles(layer: nn.Module, hidden: Any) -> bool:
    """Whether `compile_layers: auto` compiles `layer`'s forward of `hidden`: on a CUDA device, unsharded (FSDP2
    unshards a layer's parameters in hooks around its call), and not after a failed compilation."""
    on_cuda = isinstance(hidden, torch.Tensor) and hidden.device.type == "cuda"
    return on_cuda and not isinstance(layer, FSDPModule) and type(layer) not in _FAILED


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a transformers causal LM (its decoder's `layers`), [] where it has none."""
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    layers = getattr(decoder, "layers", None)
    return list(layers) if isinstance(layers, nn.ModuleList) else []


def compile_decoder_layers(model: nn.Module, mode: str) -> int:
    """Give the model's decoder layers the compiled forward of `mode` (in place); how many were changed."""
    if mode not in COMPILE_LAYERS:
        raise ValueError(f"model.compile_layers={mode!r} is not valid; choose one of {list(COMPILE_LAYERS)}")
    if mode == "none":
        return 0
    layers = decoder_layers(model)
    if not layers and mode == "auto":
        return 0
    if not layers:
        raise ValueError(
            f"model.compile_layers={mode!r}: {type(model).__name__} has no decoder layers to compile "
            "(a transformers causal LM whose decoder keeps them in `layers`); use compile_layers: none"
        )
    for layer in layers:
        layer.forward = functools.partial(_layer_forward, layer, mode)  # a partial pickles and deep-copies
    return len(layers)

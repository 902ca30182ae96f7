"""How static decoding runs its step (`static_decode.decode_step`): `StaticCacheGeneration(compile=...)`.

* `none`: the step as Python calls it (every operator launched from Python: the reference, and a CPU's fastest).
* `aot_eager`: `torch.compile(fullgraph=True, backend="aot_eager")`: the step traced as one graph and run by
  torch's own operators (no code generation; checks on any machine that the step traces without a graph break).
* `default`: `torch.compile(fullgraph=True)` with inductor (fused kernels, launched from Python), its reductions
  left whole (`inductor_options`).
* `reduce-overhead`: the same with inductor's CUDA graphs (gpt-fast's `decode_one_token`): one graph launch per
  step, the workspace's buffers marked as static addresses so nothing is copied in.
* `compiled-forward`: the model's forward compiled by inductor (its layers' kernels fused), the rest of the step
  (sampling, the rows' bookkeeping) as Python writes it, the whole captured by `torch.cuda.CUDAGraph`: one graph
  launch per step that needs no code generated for the sampling.
* `cuda-graph`: the eager step captured by `torch.cuda.CUDAGraph` (no compiler): one graph launch per step with
  the same kernels as `none`.
* `auto`: `compiled-forward` on a CUDA device, `none` elsewhere. Where the compiler fails (no working Triton, an
  operator inductor cannot lower), `StaticCacheGeneration` warns and runs the step as `fallback_mode` says from then
  on: on a CUDA device `cuda-graph` (it needs no compiler), then `none` if the capture fails too.

`auto` does not start from `reduce-overhead`: at SmolLM2-135M's and Qwen2.5-1.5B's shapes (128 rows, bf16, torch
2.11 on an H200, 2026-12-04) inductor failed to generate the sampling's reductions over the vocabulary (`NYI
TritonSplitDimKernel reductions`; with split reductions, a `TypeError` in the split softmax) after a minute of
compiling, while `compiled-forward` decoded SmolLM2's step in 2.17 ms (eager step in a CUDA graph: 4.22 ms;
`bash scripts/gpu_check.sh decode`).

Every mode is `fullgraph=True`: a graph break is an error, not a silent slow path. Random draws stay outside the
step (`StaticCacheGeneration` draws each step's uniforms into the workspace), so no mode needs the generator's
state inside a graph.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import threading
from collections.abc import Callable
from typing import Literal

import torch
from torch import nn

from rlvr_lightning.generation.static_cache import DecodeWorkspace
from rlvr_lightning.generation.static_decode import StepOptions, decode_step
from rlvr_lightning.runtime.global_random import GLOBAL_RANDOM_LOCK
from rlvr_lightning.runtime.recompile_limit import raise_recompile_limit

COMPILE_MODES = ("auto", "none", "aot_eager", "default", "reduce-overhead", "compiled-forward", "cuda-graph")
CompileMode = Literal["auto", "none", "aot_eager", "default", "reduce-overhead", "compiled-forward", "cuda-graph"]
CAPTURED_MODES = ("compiled-forward", "cuda-graph")  # captured by `captured_cuda_graph` (needs a CUDA device)
# one compiled step per (row bucket, sampling options, model): more than dynamo's default of 8 in a long run
RECOMPILE_LIMIT = 64
# the calls of a compiled step that may compile or record (inductor's CUDA graphs: a warm-up run, then the recording)
RECORDING_CALLS = 3


def check_compile_mode(value: str) -> None:
    if value not in COMPILE_MODES:
        raise ValueError(f"StaticCacheGeneration compile={value!r} is not valid; choose one of {list(COMPILE_MODES)}")


def resolve_compile_mode(mode: str, device: torch.device) -> str:
    if mode == "auto":
        return "compiled-forward" if device.type == "cuda" else "none"
    if mode in ("reduce-overhead", *CAPTURED_MODES) and device.type != "cuda":
        raise ValueError(f"StaticCacheGeneration compile={mode!r} needs a CUDA device; the model is on {device}")
    return mode


class CaptureFailed(RuntimeError):
    """Recording the step in a CUDA graph failed (an operator that cannot be captured), or a compiled step failed in
    its first calls (compilation, inductor's recording: a recompile limit hit, a kernel that cannot launch)."""


def fallback_mode(failed: str, device: torch.device) -> str:
    """The mode `compile="auto"` runs the step in once `failed` failed on `device`. On a CUDA device, after a failed
    compiler: a CUDA graph of the eager step (one launch per step, no compiler); else, and elsewhere, the step as
    Python calls it."""
    if device.type != "cuda" or failed in ("cuda-graph", "none"):
        return "none"
    return "cuda-graph"


def capture_pending(ws: DecodeWorkspace, model: nn.Module, options: StepOptions, mode: str) -> bool:
    """Whether `runnable_step` will capture a CUDA graph, which runs warm-up steps on the workspace (load it again
    after). A graph holds the addresses of the weights it read: when they moved, the workspace's graphs go."""
    if mode not in CAPTURED_MODES:
        return False
    if ws.weights_moved(model):
        ws.steps.clear()
    return (options, mode) not in ws.steps


def runnable_step(ws: DecodeWorkspace, model: nn.Module, options: StepOptions, mode: str) -> Callable[[], None]:
    """The workspace's decoding step for `options` in `mode`, built once per workspace and kept in it (a captured
    step is captured here: `capture_pending`)."""
    key = (options, mode)
    if mode == "reduce-overhead":
        cudagraph_trees_in_this_thread()  # background rollouts decode in a thread of their own
    if key not in ws.steps:
        step = functools.partial(decode_step, ws, model, options)
        if mode == "none":
            ws.steps[key] = step
        elif mode == "cuda-graph":
            ws.steps[key] = captured_cuda_graph(step)
        elif mode == "compiled-forward":
            forward = compiled_forward(model)
            ws.steps[key] = captured_cuda_graph(functools.partial(decode_step, ws, forward, options), compiles=True)
        else:
            ws.steps[key] = compiled(step, mode)
    return ws.steps[key]


def compiled(step: Callable[[], None], mode: str) -> Callable[[], None]:
    """`torch.compile(step, fullgraph=True, dynamic=False)`: each row bucket is its own static-shape graph. Its
    first calls (compilation, then inductor's CUDA-graph warm-up and recording) hold `GLOBAL_RANDOM_LOCK`."""
    raise_recompile_limit(RECOMPILE_LIMIT)
    if mode == "aot_eager":
        graph = torch.compile(step, fullgraph=True, dynamic=False, backend="aot_eager")
    else:
        graph = torch.compile(step, fullgraph=True, dynamic=False, options=inductor_options(mode))
    calls = 0

    def run() -> None:
        nonlocal calls
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's graph outputs are no longer read
        if calls >= RECORDING_CALLS:
            graph()
            return
        calls += 1
        with GLOBAL_RANDOM_LOCK:
            try:
                graph()
            except (torch.OutOfMemoryError, torch._dynamo.exc.TorchDynamoException):
                raise  # the caller's fallback takes a compiler's errors as they are; memory is no mode's fault
            except Exception as error:  # noqa: BLE001 - any other failure while compiling or recording
                message = f"the compiled decoding step ({mode}) failed in its first calls: {error}"
                raise CaptureFailed(message) from error

    return run


def compiled_forward(model: nn.Module) -> nn.Module:
    """`model` whose forward inductor compiles as one static-shape graph (`fullgraph=True`, its reductions whole)."""
    raise_recompile_limit(RECOMPILE_LIMIT)
    return torch.compile(model, fullgraph=True, dynamic=False, options=inductor_options("default"))


def inductor_options(mode: str) -> dict:
    """Inductor's options for `mode` ("default", "reduce-overhead") with its reductions left whole. At a large
    vocabulary and few rows inductor splits the softmax's reductions over the vocabulary in two; on torch 2.11 with
    CUDA generating the split softmax of the EOS-suppressed logits failed (`InductorError: TypeError: list indices
    must be integers or slices, not NoneType`; SmolLM2's and Qwen2.5-1.5B's shapes at 128 rows on an H200,
    2026-12-04) while the tiny models' unsplit ones compiled. One block per row still fills the device at such row
    counts."""
    from torch._inductor import list_mode_options

    return {**list_mode_options(mode), "split_reductions": False}


def captured_cuda_graph(step: Callable[[], None], warmup: int = 2, compiles: bool = False) -> Callable[[], None]:
    """`step` recorded in a `torch.cuda.CUDAGraph` after `warmup` runs on a side stream (PyTorch's recipe for
    capture: lazy initialisations, the allocator's pool and, where `step` `compiles`, compilation settle first);
    calling the result replays it."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with GLOBAL_RANDOM_LOCK, torch.cuda.stream(stream), uncached_autocast("cuda"):
        for _ in range(warmup):
            try:
                step()
            except (torch.OutOfMemoryError, torch._dynamo.exc.TorchDynamoException):
                raise
            except Exception as error:  # noqa: BLE001 - a compiled forward that fails in its first calls
                if not compiles:
                    raise
                raise CaptureFailed(f"the compiled forward failed in its warm-up: {error}") from error
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        # thread_local: other threads (the update) may run kernels meanwhile
        with GLOBAL_RANDOM_LOCK, torch.cuda.graph(graph, capture_error_mode="thread_local"), uncached_autocast("cuda"):
            step()
    except RuntimeError as error:
        if isinstance(error, torch.OutOfMemoryError):
            raise
        raise CaptureFailed(f"capturing the decoding step in a CUDA graph failed: {error}") from error
    return graph.replay


def uncached_autocast(device_type: str) -> contextlib.AbstractContextManager:
    """The caller's autocast without its cache of cast weights: a captured graph must record the casts, not read
    the cached copies, which are freed when the cache is cleared (after every optimizer step) and miss in-place
    updates. PyTorch refuses the cache in `make_graphed_callables` for the same reason."""
    if not torch.is_autocast_enabled(device_type):
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=torch.get_autocast_dtype(device_type), cache_enabled=False)


def cudagraph_trees_in_this_thread() -> None:
    """Inductor's CUDA graphs (`reduce-overhead`) keep their trees in per-thread state set up when torch imports
    them, for that thread only: before torch 2.12 a graph first recorded in another Python thread fails an
    assertion (pytorch/pytorch#123177). Set this thread's state up as later releases do (`_initialize_tls`,
    pytorch/pytorch#184357); a no-op there and in a thread that has it."""
    from torch._inductor import cudagraph_trees as trees

    if hasattr(trees, "_initialize_tls") or torch._C._is_key_in_tls("tree_manager_containers"):
        return
    trees.local.tree_manager_containers = {}
    trees.local.tree_manager_locks = collections.defaultdict(threading.Lock)
    torch._C._stash_obj_in_tls("tree_manager_containers", trees.local.tree_manager_containers)
    torch._C._stash_obj_in_tls("tree_manager_locks", trees.local.tree_manager_locks)

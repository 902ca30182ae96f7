"""`StaticCacheGeneration`: our decoding loop in a form a CUDA graph can hold (gpt-fast's `generate.py`,
transformers' `generate(cache_implementation="static")`).

The eager loop (`KVCacheGeneration`, `generation/loop.py`) launches every operator of a step from Python, on
shapes that change every step (the cache grows, finished rows are dropped, the mask is re-sliced), and reads the
step's tokens on the host. Here the device state is preallocated (`static_cache.DecodeWorkspace`), a step is one
function of it with fixed shapes (`static_decode.decode_step`) that runs eagerly, compiled or as a CUDA graph
(`step_capture.py`), finished rows stay in the batch (fed pad; their tokens are discarded), EOS and per-row caps
are checked on the device, and the host reads the sampled tokens once every `sync_every` steps.

Between reads the host replays the block's steps with the eager loop's own rules (`RowEnds`: EOS, stop strings on
the decoded text, caps), so every row ends where the eager loop ends it; a row that met a stop string is fed pad
from the read on, and the steps decoded after every row ended are discarded.

Same random stream: each step draws one uniform per row, `torch.rand((rows, 1))`, outside the step, as the eager
loop does when it keeps finished rows in the batch (`generate(compact=False)`), so for the same generator state
both sample the same tokens (with compaction the eager loop draws for the unfinished rows only). The generator's
state after the last step is restored, so the steps decoded past the end leave no trace in the stream.
"""

from __future__ import annotations

import functools
import time
import warnings
from typing import Annotated

import torch
from torch import Tensor, nn

from rlvr_lightning.generation.decode_attention import decoding_attention
from rlvr_lightning.generation.loop import KVCacheGeneration, host_to_device, response_output
from rlvr_lightning.generation.output import GenerationOutput, StopStringChecker
from rlvr_lightning.generation.row_ends import RowEnds
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.generation.sampling_precision import SamplingDtype
from rlvr_lightning.generation.static_cache import WorkspacePool, prefill, static_cache_support
from rlvr_lightning.generation.static_decode import StepOptions, sample_step
from rlvr_lightning.generation.step_capture import (
    CaptureFailed,
    CompileMode,
    capture_pending,
    check_compile_mode,
    fallback_mode,
    resolve_compile_mode,
    runnable_step,
)
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import POSITIVE_INT
from rlvr_lightning.runtime.stage_reports import report_tokens
from rlvr_lightning.runtime.timing import elapsed_seconds


@documented_options
class StaticCacheGeneration(KVCacheGeneration):
    """Our loop over a static KV cache, its step run eagerly, compiled or as a CUDA graph; the default on CUDA."""

    def __init__(
        self,
        dtype: Annotated[
            SamplingDtype,
            Option(
                "the precision it samples in, as `KVCacheGeneration`'s (a bf16 copy of fp32 weights is refreshed "
                "in place, so a captured graph keeps reading the current weights)."
            ),
        ] = "auto",
        compile: Annotated[
            CompileMode,
            Option(
                'how the step runs (`generation/step_capture.py`): "auto" (the default: "compiled-forward" on a '
                'CUDA device, "none" elsewhere; where the compiler fails, a warning and, on a CUDA device, '
                '"cuda-graph", then "none"), "none", "aot_eager", "default", "reduce-overhead", '
                '"compiled-forward", "cuda-graph".'
            ),
        ] = "auto",
        sync_every: Annotated[
            int,
            Option(
                "the host reads the sampled tokens every this many steps (at most `sync_every - 1` steps are "
                "decoded past the last row's end). 1 reads every step, as the eager loop does.",
                POSITIVE_INT,
            ),
        ] = 8,
    ) -> None:
        check_options(StaticCacheGeneration, locals())
        check_compile_mode(compile)
        super().__init__(dtype)
        self.compile, self.sync_every = compile, sync_every
        self._workspaces = WorkspacePool()
        self._compile_failed: str | None = None  # the mode `compile="auto"` runs once its own failed on this machine

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_workspaces": WorkspacePool()}  # buffers and graphs never travel (deepcopy)

    def sleep(self) -> None:
        """Free the workspaces (their KV caches and graphs); the next generation allocates and captures again."""
        self._workspaces.clear()

    def _decode(self, model, prompt_ids, prompt_mask, n, sampling, **kwargs) -> GenerationOutput:
        reason = static_cache_support(model)
        if reason is not None:
            raise ValueError(f"StaticCacheGeneration cannot decode this model: {reason}; use KVCacheGeneration")
        mode = self._compile_failed or resolve_compile_mode(self.compile, prompt_ids.device)
        run = functools.partial(
            static_generate, model, prompt_ids, prompt_mask, n, sampling, pool=self._workspaces, **kwargs
        )
        random = RandomStream(kwargs.get("generator"), prompt_ids.device).generator
        before = random.get_state()
        with torch.no_grad():
            while True:
                try:
                    return run(mode=mode, sync_every=self.sync_every)
                except (torch._dynamo.exc.TorchDynamoException, CaptureFailed) as error:
                    if self.compile != "auto" or mode == "none":
                        raise
                    mode = self._fall_back(mode, fallback_mode(mode, prompt_ids.device), error)
                    random.set_state(before)  # the next attempt samples what this one would have

    def _fall_back(self, failed: str, fallback: str, error: Exception) -> str:
        """Warn that the default's `failed` mode does not work on this machine and run `fallback` from now on."""
        how = {
            "compiled-forward": "as a CUDA graph of the step around the compiled forward",
            "cuda-graph": "as a CUDA graph of the eager step (no compiler)",
        }.get(fallback, "eagerly")
        warnings.warn(
            f"StaticCacheGeneration: {'capturing' if failed == 'cuda-graph' else 'compiling'} the decoding step "
            f"({failed!r}) failed, so it runs {how} from now on (`compile: {fallback}` chooses that without "
            f"trying). The error: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}",
            stacklevel=3,
        )
        self._compile_failed = fallback
        return fallback


class RandomStream:
    """Each step's uniforms from `generator` (None: the device's default generator), and its state before each
    draw, so that the state after the last step that counts can be restored."""

    def __init__(self, generator: torch.Generator | None, device: torch.device) -> None:
        if generator is None:
            generator = torch.default_generator
            if device.type == "cuda":
                index = device.index if device.index is not None else torch.cuda.current_device()  # cuda:0 is index 0
                generator = torch.cuda.default_generators[index]
        self.generator = generator
        self.states: dict[int, Tensor] = {}

    def draw(self, step: int, out: Tensor) -> None:
        self.states[step] = self.generator.get_state()
        torch.rand(out.shape, generator=self.generator, dtype=out.dtype, device=out.device, out=out)

    def rewind_to(self, step: int) -> None:
        """The state before the draw of `step`, if it was drawn (the steps from `step` on do not count); the states
        kept so far are forgotten."""
        if step in self.states:
            self.generator.set_state(self.states[step])
        self.states.clear()


def static_generate(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    n: int,
    sampling: SamplingConfig,
    *,
    pool: WorkspacePool,
    mode: str,
    sync_every: int,
    stop: StopStringChecker | None,
    eos_token_ids,
    pad_token_id: int,
    max_new_tokens_per_prompt=None,
    generator: torch.Generator | None = None,
) -> GenerationOutput:
    """`n` continuations of each left-padded distinct prompt `[B, P]` (rows `i*n .. i*n+n-1` of prompt `i`), as
    `loop.generate(..., compact=False)` samples them; see the module's docstring."""
    start = time.perf_counter()
    device, max_new = prompt_ids.device, sampling.max_new_tokens
    used = prompt_ids.shape[0] * n
    cache, logits, positions = prefill(model, prompt_ids, prompt_mask)
    prefill_seconds = elapsed_seconds(start, device)
    layer = cache.layers[0]
    ws = pool.get(model, used, prompt_ids.shape[1] + max_new, layer.keys, layer.values)
    eos = host_to_device(sorted(set(eos_token_ids)), device, torch.long)
    options = StepOptions(
        sampling.temperature,
        sampling.top_k,
        sampling.top_p,
        sampling.do_sample,
        suppress_eos=sampling.min_new_tokens > 0 and eos.numel() > 0,
        pad_token_id=pad_token_id,
        min_p=sampling.min_p,
    )
    per_prompt = max_new_tokens_per_prompt
    caps = [max_new] * used if per_prompt is None else [cap for cap in per_prompt for _ in range(n)]
    rows = RowEnds(used, max_new, eos_token_ids, stop, None if per_prompt is None else caps)
    random = RandomStream(generator, device) if sampling.do_sample else None
    with decoding_attention(model):
        first = ws.load(cache, logits, prompt_mask, positions, n)
        ws.start(used, caps, eos, sampling.min_new_tokens)
        if max_new > 1 and capture_pending(ws, model, options, mode):
            runnable_step(ws, model, options, mode)  # captured after warm-up steps on the workspace: load it again
            first = ws.load(cache, logits, prompt_mask, positions, n)
            ws.start(used, caps, eos, sampling.min_new_tokens)
        del cache, logits
        step = runnable_step(ws, model, options, mode) if max_new > 1 else None
        steps, reads = decode_blocks(ws, first, step, options, rows, random, used, max_new, sync_every, stop)
    out = response_output(rows, ws.tokens[:used], ws.log_probs[:used], steps, pad_token_id)
    out.seconds, out.prefill_seconds = elapsed_seconds(start, device), prefill_seconds
    out.stats = {"host_reads": float(reads)}
    return out


def decode_blocks(ws, first, step, options, rows, random, used, max_new, sync_every, stop) -> tuple[int, int]:
    """Decode in blocks of `sync_every` steps, one host read per block, until every row ended or `max_new`
    steps; (the eager loop's step count, the host reads)."""
    done, reads = 0, 0
    while done < max_new:
        end = min(done + sync_every, max_new)
        for t in range(done, end):
            if random is not None:
                random.draw(t, ws.uniform[:used])
            if t == 0:
                sample_step(ws, first, options)
            else:
                step()
        block = ws.tokens[:used, done:end].tolist()  # the block's one host read
        reads += 1
        report_tokens(end, max_new)
        for t in range(done, end):
            rows.end([row[t - done] for row in block], t)
            if not any(rows.alive):
                end = t + 1
                break
        if random is not None:
            random.rewind_to(end)
        done = end
        if not any(rows.alive):
            break
        if stop:  # rows that met a stop string in the block are fed pad from now on
            ws.alive[:used].copy_(host_to_device(rows.alive, ws.device, torch.bool))
    return done, reads

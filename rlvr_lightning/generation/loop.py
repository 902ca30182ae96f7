"""Batched sampling for causal language models: left padding, a KV cache, stop conditions.

The loop (`generate`) is written by hand instead of calling `model.generate` so that it can

* prefill every distinct prompt once and repeat its KV cache `n` times (group sampling),
* drop finished rows from the batch and the cache as soon as they finish (no compute spent on padding),
* return the log-prob of every sampled token under the *unfiltered* distribution at the sampling
  temperature (what `token_log_probs` recomputes), and
* use the global torch RNG, so `lightning.seed_everything` governs it (or a `generator` of its own, for
  sampling in a background thread while the training thread draws from the global one).

Everything here is model-agnostic: it needs a transformers-style causal LM that accepts
`input_ids`, `attention_mask`, `position_ids`, `cache` (or `past_key_values`), `use_cache` and returns `.logits`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from rlvr_lightning.generation.backend import GenerationBackend
from rlvr_lightning.generation.kv_cache import cache_argument, reserve_room, returned_cache
from rlvr_lightning.generation.output import GenerationOutput, StopStringChecker
from rlvr_lightning.generation.row_ends import RowEnds
from rlvr_lightning.generation.sampling_precision import (
    SamplingDtype,
    SamplingWeights,
    check_sampling_dtype,
    resolve_sampling_dtype,
)
from rlvr_lightning.generation.stop_strings import stop_string_end_filter
from rlvr_lightning.generation.token_sampling import sample_next_token
from rlvr_lightning.runtime.devices import compute_device
from rlvr_lightning.runtime.stage_reports import report_tokens
from rlvr_lightning.runtime.timing import elapsed_seconds


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Left-pad token id lists into `ids long[B, P]` and `mask long[B, P]`."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if len(seq):
            ids[row, width - len(seq) :] = torch.as_tensor(list(seq), dtype=torch.long)
            mask[row, width - len(seq) :] = 1
    return ids, mask


def position_ids_from_mask(mask: Tensor) -> Tensor:
    """Positions counting only real tokens (`cumsum - 1`), 0 on left padding."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def _supports_logits_to_keep(model: nn.Module) -> bool:
    import inspect

    base = model
    get_base = getattr(model, "get_base_model", None)
    if callable(get_base):
        base = get_base()
    try:
        return "logits_to_keep" in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return False


def _generate(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    n: int,
    *,
    max_new_tokens: int,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    stop: StopStringChecker | None = None,
    compact: bool = True,
    do_sample: bool = True,
    min_new_tokens: int = 0,
    max_new_tokens_per_prompt: Sequence[int] | None = None,
    generator: torch.Generator | None = None,
) -> GenerationOutput:
    """Sample `n` continuations of each left-padded prompt (rows `i*n .. i*n+n-1` belong to prompt `i`).

    `prompt_ids/prompt_mask [B, P]` are the *distinct* prompts: they are prefilled once and their KV
    cache is repeated `n` times. Finished rows (EOS or stop string) are removed from the batch when
    `compact` (and the cache supports it); the loop ends when every row has finished. With
    `do_sample=False` every row decodes greedily (argmax), so the `n` rows of a prompt are equal.
    EOS cannot be sampled before `min_new_tokens` tokens (stop strings still end a row).
    `max_new_tokens_per_prompt` (each at most `max_new_tokens`) caps the rows of each prompt on their own;
    a row that reaches its cap is truncated like one that reaches `max_new_tokens`. Random draws come
    from `generator` (None: torch's global generator).
    """
    start = time.perf_counter()
    device = prompt_ids.device
    num_rows = prompt_ids.shape[0] * n
    eos = torch.as_tensor(sorted(set(eos_token_ids)), dtype=torch.long, device=device)
    cache, logits, positions = _prefill(model, prompt_ids, prompt_mask, n, max_new_tokens)
    prefill_seconds = elapsed_seconds(start, device)

    prompt_len = prompt_ids.shape[1]
    # the attention mask of every position a row may reach, its next position, and the sampled tokens
    attention = torch.ones((num_rows, prompt_len + max_new_tokens), dtype=prompt_mask.dtype, device=device)
    attention[:, :prompt_len] = prompt_mask.repeat_interleave(n, dim=0)
    next_position = positions[:, -1].repeat_interleave(n, dim=0) + 1
    tokens_out = torch.full((num_rows, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
    log_probs_out = torch.zeros((num_rows, max_new_tokens), dtype=torch.float32, device=device)

    caps = None if max_new_tokens_per_prompt is None else [cap for cap in max_new_tokens_per_prompt for _ in range(n)]
    rows = RowEnds(num_rows, max_new_tokens, eos_token_ids, stop, caps)
    active_rows = torch.arange(num_rows, device=device)
    dead_inputs = None  # bool[B] on the device: rows kept in the batch (no compaction) that ended; they are fed pad
    steps = 0
    for step in range(max_new_tokens):
        steps = step + 1
        suppress = eos if step < min_new_tokens else None
        token, log_prob = sample_next_token(logits, temperature, top_k, top_p, do_sample, suppress, generator, min_p)
        tokens_out[active_rows, step] = token  # rows that ended earlier are overwritten with pad at the end
        log_probs_out[active_rows, step] = log_prob
        report_tokens(step + 1, max_new_tokens)

        ended = rows.end(token.tolist(), step)  # the step's one host synchronisation
        if step == max_new_tokens - 1 or not any(rows.alive):
            break
        if ended:
            kept = _compact(cache, rows, [active_rows, token, attention, next_position]) if compact else None
            if kept is not None:
                active_rows, token, attention, next_position = kept
            else:
                compact = False
                dead_inputs = host_to_device([not flag for flag in rows.alive], device, torch.bool)
        if dead_inputs is not None:
            token = token.masked_fill(dead_inputs, pad_token_id)

        cache, logits = _decode(model, cache, token, attention[:, : prompt_len + step + 1], next_position)
        next_position = next_position + 1
    del cache

    out = response_output(rows, tokens_out, log_probs_out, steps, pad_token_id)
    out.seconds, out.prefill_seconds = elapsed_seconds(start, device), prefill_seconds
    return out


def _compact(cache: Any, rows: RowEnds, tensors: list[Tensor]) -> list[Tensor] | None:
    """Drop the ended rows from the cache, `rows` and `tensors` (per batch row); None: the cache cannot."""
    keep = [i for i, flag in enumerate(rows.alive) if flag]
    keep_index = host_to_device(keep, tensors[0].device, torch.long)
    try:
        cache.batch_select_indices(keep_index)
    except (NotImplementedError, AttributeError):
        return None
    rows.keep(keep)
    return [tensor[keep_index] for tensor in tensors]


def _decode(model: nn.Module, cache: Any, token: Tensor, attention: Tensor, position: Tensor) -> tuple[Any, Tensor]:
    """One decoding step's forward: the cache and the next-token logits [B, V]."""
    out = model(
        input_ids=token.unsqueeze(-1),
        attention_mask=attention,
        position_ids=position.unsqueeze(-1),
        use_cache=True,
        **cache_argument(model, cache),
    )
    return returned_cache(out), out.logits[:, -1, :]


def response_output(
    rows: RowEnds, tokens: Tensor, log_probs: Tensor, steps: int, pad_token_id: int
) -> GenerationOutput:
    """The decoded rows cut to their lengths (pad and log-prob 0 after a row's end)."""
    device = tokens.device
    width = min(max(max(rows.lengths), 1), steps) if rows.lengths else 1
    lengths = host_to_device(rows.lengths, device, torch.long)
    mask = torch.arange(width, device=device).unsqueeze(0) < lengths.unsqueeze(-1)
    return GenerationOutput(
        response_ids=tokens[:, :width].masked_fill(~mask, pad_token_id),
        response_mask=mask.float(),
        truncated=~host_to_device(rows.finished, device, torch.bool),
        log_probs=log_probs[:, :width].masked_fill(~mask, 0.0),
        stopped_by_string=host_to_device(rows.by_string, device, torch.bool),
        seconds=0.0,
        steps=steps,
    )


def _prefill(
    model: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, n: int, max_new_tokens: int
) -> tuple[Any, Tensor, Tensor]:
    """The distinct prompts' forward, its KV cache repeated `n` times: (cache, last logits [B * n, V], positions)."""
    from transformers import DynamicCache

    keep_kwargs = {"logits_to_keep": 1} if _supports_logits_to_keep(model) else {}
    positions = position_ids_from_mask(prompt_mask)
    config = getattr(model, "config", None)
    cache = DynamicCache(config=config) if config is not None else DynamicCache()
    reserve_room(cache, prompt_ids.shape[1] + max_new_tokens)
    out = model(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=positions,
        use_cache=True,
        **cache_argument(model, cache),
        **keep_kwargs,
    )
    cache = returned_cache(out)
    logits = out.logits[:, -1, :]
    del out
    if n > 1:
        cache.batch_repeat_interleave(n)
        logits = logits.repeat_interleave(n, dim=0)
    return cache, logits, positions


def host_to_device(values: list, device: torch.device, dtype: torch.dtype) -> Tensor:
    """`values` as a tensor on `device`, queued without waiting for the device (a CUDA copy from pageable
    memory synchronises; one from pinned memory is ordered on the stream like a kernel)."""
    tensor = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


@functools.wraps(_generate)
def generate(*args, **kwargs) -> GenerationOutput:
    # under `torch.inference_mode` (decoding steps of a small model ~15% faster than under `no_grad`),
    # with the outputs turned back into normal tensors that autograd may save later
    with torch.inference_mode():
        out = _generate(*args, **kwargs)
    for name in ("response_ids", "response_mask", "truncated", "log_probs", "stopped_by_string"):
        setattr(out, name, getattr(out, name).clone())
    return out


class KVCacheGeneration(GenerationBackend):
    """The loop above (`generate`) over the training model itself, as a `GenerationBackend`.

    Args:
        dtype: the precision the loop samples in. "auto" (the default): the trainer's compute dtype (FSDP2's
            `param_dtype`, autocast's under `bf16-mixed`, else the weights'), so the model samples as it trains.
            "bfloat16" over fp32 weights: a bf16 copy of the weights samples, refreshed after every update
            (`generation/sampling_precision.py`); the fp32 master weights are untouched. "float32": the model as
            it is, or an fp32 copy of bf16 weights. Sampling log-probs of a bf16 pass differ from the trainer's
            fp32 ones: `RLVRModule(rollout_is=...)` corrects the mismatch, logged as `train/mismatch/*`.
    """

    def __init__(self, dtype: SamplingDtype = "auto") -> None:
        check_sampling_dtype(f"{type(self).__name__} dtype", dtype)
        self.dtype = dtype
        self._weights = SamplingWeights()

    def generate(
        self,
        model,
        tokenizer,
        prompt_token_ids,
        n,
        sampling,
        *,
        eos_token_ids,
        pad_token_id,
        max_new_tokens=None,
        generator=None,
    ):
        device = compute_device(model)
        sampler = self._weights.model_for(model, resolve_sampling_dtype(self.dtype, model))
        precision = self._weights.precision(model, sampler, device.type)
        model = sampler
        prompt_ids, prompt_mask = left_pad(prompt_token_ids, pad_token_id)
        stop = StopStringChecker(
            sampling.stop_strings,
            lambda rows: tokenizer.batch_decode(rows, skip_special_tokens=True),
            stop_string_end_filter(tokenizer, sampling.stop_strings),
        )
        was_training = model.training
        model.eval()  # no dropout while sampling; gradient checkpointing would also turn the cache off
        try:
            with precision:
                return self._decode(
                    model,
                    prompt_ids.to(device),
                    prompt_mask.to(device),
                    n,
                    sampling,
                    stop=stop,
                    eos_token_ids=eos_token_ids,
                    pad_token_id=pad_token_id,
                    max_new_tokens_per_prompt=max_new_tokens,
                    generator=generator,
                )
        finally:
            model.train(was_training)

    def _decode(self, model, prompt_ids, prompt_mask, n, sampling, **kwargs) -> GenerationOutput:
        """The decoding of the left-padded distinct prompts by the model to sample from (already cast, in eval mode);
        `kwargs`: `stop`, `eos_token_ids`, `pad_token_id`, `max_new_tokens_per_prompt`, `generator`."""
        return generate(
            model,
            prompt_ids,
            prompt_mask,
            n,
            max_new_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            min_p=sampling.min_p,
            do_sample=sampling.do_sample,
            min_new_tokens=sampling.min_new_tokens,
            **kwargs,
        )

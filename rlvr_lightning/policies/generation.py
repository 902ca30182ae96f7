"""Batched sampling for causal language models: left padding, a KV cache, stop conditions.

The loop (`generate`) is written by hand instead of calling `model.generate` so that it can

* prefill every distinct prompt once and repeat its KV cache `n` times (group sampling),
* drop finished rows from the batch and the cache as soon as they finish (no compute spent on padding),
* return the log-prob of every sampled token under the *unfiltered* distribution at the sampling
  temperature (what `token_log_probs` recomputes), and
* use the global torch RNG, so `lightning.seed_everything` governs it (or a `generator` of its own, for
  sampling in a background thread while the training thread draws from the global one).

Everything here is model-agnostic: it needs a transformers-style causal LM that accepts
`input_ids`, `attention_mask`, `position_ids`, `past_key_values`, `use_cache` and returns `.logits`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from rlvr_lightning.progress import report_tokens


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


def filter_logits(logits: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Top-k then nucleus (top-p) filtering of `logits [B, V]`: removed entries become -inf."""
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # remove a token when the tokens ranked above it already cover top_p (the top one always stays)
        remove = (probs.cumsum(-1) - probs) > top_p
        sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits


def _sample_categorical(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One draw per row of `probs [B, V]` by inverting the CDF with one uniform per row.

    Same distribution as `torch.multinomial(probs, 1)`, whose CPU kernel draws an exponential
    variate per vocabulary entry (~10% of a SmolLM2 decoding step); this draws one number per row.
    """
    cdf = probs.cumsum(dim=-1)
    u = torch.rand((probs.shape[0], 1), device=probs.device, dtype=cdf.dtype, generator=generator) * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)
    # `u` rounding up to the total mass can land on a zero-probability tail token: take the mode then
    valid = probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) > 0
    if bool(valid.all()):
        return tokens
    return torch.where(valid, tokens, probs.argmax(dim=-1))


def sample_next_token(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    do_sample: bool = True,
    suppress: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Sample one token per row of `logits [B, V]` (the argmax when `do_sample` is False).

    `suppress` (token ids) are never chosen (e.g. EOS before `min_new_tokens`); draws come from `generator`
    (None: torch's global generator). Returns
    `(tokens long[B], log_probs float[B])`; the log-probs are under the unfiltered
    `softmax(logits / temperature)`, i.e. what `token_log_probs` recomputes for the same tokens.
    """
    scaled = logits.float()
    if temperature != 1.0:
        scaled = scaled / temperature
    choose_from = scaled
    if suppress is not None and suppress.numel():
        choose_from = scaled.index_fill(-1, suppress, float("-inf"))
    if do_sample:
        filtered = filter_logits(choose_from, top_k=top_k, top_p=top_p)
        probs = torch.softmax(filtered, dim=-1)
        tokens = _sample_categorical(probs, generator)
        if filtered is scaled:  # nothing filtered: the sampling distribution is the unfiltered one
            return tokens, probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).log()
    else:
        tokens = choose_from.argmax(dim=-1)
    log_probs = scaled.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
    return tokens, log_probs


class StopStringChecker:
    """Does the decoded tail of a row's response contain one of the stop strings?"""

    def __init__(self, stop_strings: Sequence[str], decode: Callable[[list[list[int]]], list[str]]):
        self.stop_strings = [s for s in stop_strings if s]
        self.decode = decode
        longest = max((len(s) for s in self.stop_strings), default=0)
        # a character needs at most 4 byte-level tokens; +2 covers a merge at the boundary
        self.window = 4 * longest + 2

    def __bool__(self) -> bool:
        return bool(self.stop_strings)

    def check(self, tails: list[list[int]]) -> list[bool]:
        texts = self.decode(tails)
        return [any(s in text for s in self.stop_strings) for text in texts]

    def cut(self, text: str) -> tuple[str, bool]:
        """`text` up to and including its first stop string, and whether one was found."""
        found = [(text.find(s), s) for s in self.stop_strings if s in text]
        if not found:
            return text, False
        # the stop string that ends first is the one that stopped generation
        end = min(index + len(s) for index, s in found)
        return text[:end], True


@dataclass
class GenerationOutput:
    response_ids: Tensor  # long[N, T] trimmed to the longest response, pad after the end
    response_mask: Tensor  # float[N, T]
    truncated: Tensor  # bool[N]
    log_probs: Tensor  # float[N, T] sampling log-probs (0 where masked)
    stopped_by_string: Tensor  # bool[N]
    seconds: float
    prefill_seconds: float | None = None  # None: the backend does not report it
    steps: int | None = None  # decoding steps (None: not reported)
    stats: dict[str, float] = field(default_factory=dict)  # backend-specific facts (weight push time, ...)
    response_source: Tensor | None = None  # long[N, T] `TokenSource` per token, when tokens were inserted


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
    from transformers import DynamicCache

    start = time.perf_counter()
    device = prompt_ids.device
    num_rows = prompt_ids.shape[0] * n
    eos = torch.as_tensor(sorted(set(eos_token_ids)), dtype=torch.long, device=device)
    keep_kwargs = {"logits_to_keep": 1} if _supports_logits_to_keep(model) else {}

    # prefill the distinct prompts
    positions = position_ids_from_mask(prompt_mask)
    config = getattr(model, "config", None)
    cache = DynamicCache(config=config) if config is not None else DynamicCache()
    _reserve_room(cache, prompt_ids.shape[1] + max_new_tokens)
    out = model(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        **keep_kwargs,
    )
    cache = out.past_key_values
    logits = out.logits[:, -1, :]
    del out
    if n > 1:
        cache.batch_repeat_interleave(n)
        logits = logits.repeat_interleave(n, dim=0)
    prefill_seconds = time.perf_counter() - start

    prompt_len = prompt_ids.shape[1]
    attention = torch.ones((num_rows, prompt_len + max_new_tokens), dtype=prompt_mask.dtype, device=device)
    attention[:, :prompt_len] = prompt_mask.repeat_interleave(n, dim=0)
    next_position = positions[:, -1].repeat_interleave(n, dim=0) + 1

    tokens_out = torch.full((num_rows, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
    log_probs_out = torch.zeros((num_rows, max_new_tokens), dtype=torch.float32, device=device)
    lengths = torch.full((num_rows,), max_new_tokens, dtype=torch.long, device=device)
    finished = torch.zeros(num_rows, dtype=torch.bool, device=device)
    by_string = torch.zeros(num_rows, dtype=torch.bool, device=device)

    row_cap = None
    if max_new_tokens_per_prompt is not None:
        row_cap = torch.as_tensor(list(max_new_tokens_per_prompt), dtype=torch.long, device=device).repeat_interleave(n)
    active = torch.arange(num_rows, device=device)  # original row of each row of the current batch
    alive = torch.ones(num_rows, dtype=torch.bool, device=device)  # rows of the current batch still generating
    steps = 0
    for step in range(max_new_tokens):
        steps = step + 1
        suppress = eos if step < min_new_tokens else None
        token, token_log_prob = sample_next_token(logits, temperature, top_k, top_p, do_sample, suppress, generator)
        rows = active[alive]
        tokens_out[rows, step] = token[alive]
        log_probs_out[rows, step] = token_log_prob[alive]
        report_tokens(step + 1, max_new_tokens)

        done = torch.isin(token, eos) & alive
        if stop:
            candidates = (alive & ~done).nonzero().squeeze(-1).tolist()
            if candidates:
                lo = max(0, step + 1 - stop.window)
                tails = tokens_out[active[candidates], lo : step + 1].tolist()
                hits = stop.check(tails)
                hit_rows = [c for c, hit in zip(candidates, hits, strict=True) if hit]
                if hit_rows:
                    hit_index = torch.as_tensor(hit_rows, dtype=torch.long, device=device)
                    done[hit_index] = True
                    by_string[active[hit_index]] = True
        if done.any():
            lengths[active[done]] = step + 1
            finished[active[done]] = True
            alive = alive & ~done
        if row_cap is not None:
            capped = alive & (row_cap[active] <= step + 1)
            if capped.any():
                lengths[active[capped]] = step + 1
                alive = alive & ~capped
        if step == max_new_tokens - 1 or not alive.any():
            break

        if compact and not alive.all():
            keep = alive.nonzero().squeeze(-1)
            try:
                cache.batch_select_indices(keep)
            except (NotImplementedError, AttributeError):
                compact = False
            else:
                active, token, attention, next_position = active[keep], token[keep], attention[keep], next_position[keep]
                alive = alive[keep]
        token = torch.where(alive, token, torch.full_like(token, pad_token_id))

        out = model(
            input_ids=token.unsqueeze(-1),
            attention_mask=attention[:, : prompt_len + step + 1],
            position_ids=next_position.unsqueeze(-1),
            past_key_values=cache,
            use_cache=True,
        )
        cache = out.past_key_values
        logits = out.logits[:, -1, :]
        del out
        next_position = next_position + 1
    del cache

    width = max(int(lengths.max().item()), 1) if num_rows else 1
    width = min(width, steps)
    columns = torch.arange(width, device=device)
    mask = columns.unsqueeze(0) < lengths.unsqueeze(-1)
    response_ids = tokens_out[:, :width].masked_fill(~mask, pad_token_id)
    log_probs = log_probs_out[:, :width].masked_fill(~mask, 0.0)
    return GenerationOutput(
        response_ids=response_ids,
        response_mask=mask.float(),
        truncated=~finished,
        log_probs=log_probs,
        stopped_by_string=by_string,
        seconds=time.perf_counter() - start,
        prefill_seconds=prefill_seconds,
        steps=steps,
    )


def _reserve_room(cache, capacity: int) -> None:
    """Plain (full-attention) layers of a `DynamicCache` append in place instead of `torch.cat`: each decoding
    step would otherwise re-allocate every layer's keys and values. Room doubles when full, up to `capacity`."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if isinstance(layers, list):
        cache.layers = [_growing_layer(capacity) if type(layer) is DynamicLayer else layer for layer in layers]


def _growing_layer(capacity: int):
    layer = _growing_layer_class()()
    layer.capacity = capacity
    return layer


@functools.cache
def _growing_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        capacity = 0
        length = 0
        key_room = value_room = None

        def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self.length + key_states.shape[-2]
            if self.key_room is None or end > self.key_room.shape[-2]:
                room = min(max(end, 2 * self.length, 64), max(self.capacity, end))
                self.key_room = self._grown(self.key_room, key_states, room)
                self.value_room = self._grown(self.value_room, value_states, room)
            self.key_room[..., self.length : end, :] = key_states
            self.value_room[..., self.length : end, :] = value_states
            self.length = end
            return self._views()

        def _grown(self, old: Tensor | None, new: Tensor, room: int) -> Tensor:
            grown = new.new_empty((*new.shape[:-2], room, new.shape[-1]))
            if old is not None:
                grown[..., : self.length, :] = old[..., : self.length, :]
            return grown

        def _views(self) -> tuple[Tensor, Tensor]:
            self.keys, self.values = self.key_room[..., : self.length, :], self.value_room[..., : self.length, :]
            return self.keys, self.values

        def batch_repeat_interleave(self, repeats: int) -> None:
            if self.key_room is not None:
                self.key_room = self.key_room.repeat_interleave(repeats, dim=0)
                self.value_room = self.value_room.repeat_interleave(repeats, dim=0)
                self._views()

        def batch_select_indices(self, indices: Tensor) -> None:
            if self.key_room is not None:
                self.key_room, self.value_room = self.key_room[indices], self.value_room[indices]
                self._views()

    return GrowingLayer


@functools.wraps(_generate)
def generate(*args, **kwargs) -> GenerationOutput:
    # under `torch.inference_mode` (decoding steps of a small model ~15% faster than under `no_grad`),
    # with the outputs turned back into normal tensors that autograd may save later
    with torch.inference_mode():
        out = _generate(*args, **kwargs)
    for name in ("response_ids", "response_mask", "truncated", "log_probs", "stopped_by_string"):
        setattr(out, name, getattr(out, name).clone())
    return out

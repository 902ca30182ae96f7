"""Responses generated in segments, with tokens the policy did not sample inserted between them.

One mechanism for tool use (a tool's observation after each call) and the thinking budget (a forced
`</think>` when thinking runs too long). It sits above the generation backend: every round calls
`backend.generate` once, with each unfinished row's context so far (prompt + response) as its prompt
(round 0: the distinct prompts, `n` rows each; later rounds: one row per context), a per-row token cap,
and the stop strings of the rules; so our KV-cache loop and a vLLM engine both get the feature unchanged.

Between two segments each `SegmentRule` looks at the new segment and may
* insert tokens (`Insert`: an observation or forced text; `response_mask` 0, log-prob 0, `TokenSource`
  TOOL or FORCED), after which the row goes on sampling with them in its context,
* end the row (`Finish`), or
* cap how many tokens the row may sample before the rule must act (`cap`, then `at_cap`).

A row ends at EOS, at one of the user's stop strings, or when its response (inserted tokens included) fills
`sampling.max_new_tokens`, the total token budget. `sampling.min_new_tokens` applies to the first segment.
The result is a `GenerationOutput` whose `response_source` records the segments (`rollout.TokenSource`).
"""

from __future__ import annotations

import dataclasses
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from rlvr_lightning.generation.output import GenerationOutput, StopStringChecker
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.rollout import TokenSource
from rlvr_lightning.runtime.devices import compute_device


class Codec:
    """Text <-> token ids with the policy's tokenizer (inserted text is encoded without special tokens)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def decode(self, tokens: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=skip_special_tokens)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


@dataclass
class Segment:
    """Tokens sampled in one round, and how the round ended for the row."""

    tokens: list[int]
    text: str  # decoded, special tokens kept
    ended: Literal["eos", "stop", "cap"]  # EOS; a stop string; the row's cap (or the budget) without either


@dataclass
class Insert:
    """Tokens to append to the response (given as text or ids), masked out of the loss."""

    text: str | None = None
    token_ids: list[int] | None = None
    source: TokenSource = TokenSource.TOOL
    max_tokens: int | None = None  # keep at most this many tokens of it


@dataclass
class Finish:
    """End the row now (`truncated`: it did not end by itself, e.g. it ran out of turns)."""

    truncated: bool = False


@dataclass
class RowState:
    """One response being generated."""

    prompt_ids: list[int]
    prompt_text: str
    budget: int  # tokens the response may hold, inserted ones included
    tokens: list[int] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    done: bool = False
    truncated: bool = False
    stopped_by_string: bool = False
    notes: dict[str, Any] = field(default_factory=dict)  # the rules' per-row state
    metadata: dict[str, Any] = field(default_factory=dict)  # the prompt's example metadata (read only)

    @property
    def budget_left(self) -> int:
        return self.budget - len(self.tokens)

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.tokens

    def sampled_since(self, start: int) -> int:
        return sum(1 for s in self.sources[start:] if s == TokenSource.SAMPLED)


class SegmentRule(ABC):
    """Decides what happens to a row between two segments (see the module docstring)."""

    @property
    def stop_strings(self) -> list[str]:
        """Strings at which a segment stops so that `observe` can act on it."""
        return []

    def begin(self, row: RowState, codec: Codec) -> None:
        """Set up the row's state from its prompt. An optional hook: by default a rule keeps no state."""
        return None

    @abstractmethod
    def observe(self, row: RowState, segment: Segment, codec: Codec) -> Insert | Finish | None:
        """Look at the segment just appended to `row.tokens`; every rule observes, the first decision wins."""

    def cap(self, row: RowState) -> int | None:
        """Tokens the row may still sample before `at_cap` must act (None: no limit)."""
        return None

    def at_cap(self, row: RowState, codec: Codec) -> Insert | Finish:
        raise NotImplementedError(f"{type(self).__name__} returned a cap but has no at_cap")

    def stats(self, rows: Sequence[RowState]) -> dict[str, float]:
        """Metrics over the rows of one `generate_segments` call (`train/generation/...`)."""
        return {}

    def row_info(self, row: RowState) -> dict[str, Any]:
        """What the rewards should see of a finished row (merged into the rollout's metadata for that row)."""
        return {}


def generate_segments(
    backend: Any,
    model: nn.Module,
    tokenizer: Any,
    prompt_token_ids: Sequence[Sequence[int]],
    prompt_texts: Sequence[str],
    n: int,
    sampling: SamplingConfig,
    rules: Sequence[SegmentRule],
    *,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    generator: torch.Generator | None = None,
    metadata: Sequence[dict[str, Any]] | None = None,
) -> GenerationOutput:
    """`n` responses per prompt (rows `i*n .. i*n+n-1` belong to prompt `i`), generated segment by segment;
    random draws come from `generator` (None: torch's global generator). `metadata`: each prompt's example
    metadata, which the rules read (`RowState.metadata`)."""
    started = time.perf_counter()
    codec = Codec(tokenizer)
    stop_strings = list(dict.fromkeys([*sampling.stop_strings, *(s for rule in rules for s in rule.stop_strings)]))
    user_stop = StopStringChecker(
        sampling.stop_strings, lambda rows: tokenizer.batch_decode(rows, skip_special_tokens=True)
    )
    metadata = list(metadata) if metadata is not None else [{} for _ in prompt_texts]
    rows = [
        RowState(list(ids), text, sampling.max_new_tokens, metadata=meta)
        for ids, text, meta in zip(prompt_token_ids, prompt_texts, metadata, strict=True)
        for _ in range(n)
    ]
    for row in rows:
        for rule in rules:
            rule.begin(row, codec)
        _settle(row, None, rules, codec, user_stop)  # a rule may act before anything is sampled
    rounds, prefill, steps, backend_stats = 0, 0.0, 0, {}
    while True:
        if rounds == 0:  # every row of a group is still equal: one context per prompt, n rows each
            live = [rows[i] for i in range(0, len(rows), n) if not rows[i].done]
            active, n_call = [r for i in range(0, len(rows), n) if not rows[i].done for r in rows[i : i + n]], n
        else:
            live = active = [row for row in rows if not row.done]
            n_call = 1
        if not live:
            break
        caps = [_cap(row, rules) for row in live]
        min_new_tokens = min(sampling.min_new_tokens, min(caps)) if rounds == 0 else 0  # the first segment only
        round_sampling = dataclasses.replace(
            sampling, stop_strings=stop_strings, max_new_tokens=max(caps), min_new_tokens=min_new_tokens
        )
        out = backend.generate(
            model, tokenizer, [row.context for row in live], n_call, round_sampling,
            eos_token_ids=eos_token_ids, pad_token_id=pad_token_id, max_new_tokens=caps, generator=generator,
        )  # fmt: skip
        rounds += 1
        prefill += out.prefill_seconds or 0.0
        steps += out.steps or 0
        for key, value in out.stats.items():
            backend_stats[key] = backend_stats.get(key, 0.0) + value
        lengths = out.response_mask.sum(-1).long().tolist()
        ids, log_probs = out.response_ids.tolist(), out.log_probs.tolist()
        for j, row in enumerate(active):
            tokens = ids[j][: lengths[j]]
            ended = "stop" if bool(out.stopped_by_string[j]) else ("cap" if bool(out.truncated[j]) else "eos")
            row.tokens += tokens
            row.sources += [TokenSource.SAMPLED] * len(tokens)
            row.log_probs += log_probs[j][: lengths[j]]
            _settle(row, Segment(tokens, codec.decode(tokens), ended), rules, codec, user_stop)

    device = compute_device(model)
    output = _assemble(rows, pad_token_id, device)
    output.seconds = time.perf_counter() - started
    output.prefill_seconds = prefill
    output.steps = steps
    output.stats = {**backend_stats, "rounds": float(rounds), **_turn_stats(rows)}
    for rule in rules:
        output.stats.update(rule.stats(rows))
    output.row_info = [{k: v for rule in rules for k, v in rule.row_info(row).items()} for row in rows]
    return output


def _cap(row: RowState, rules: Sequence[SegmentRule]) -> int:
    caps = [row.budget_left] + [c for c in (rule.cap(row) for rule in rules) if c is not None]
    return min(caps)


def _settle(
    row: RowState, segment: Segment | None, rules: Sequence[SegmentRule], codec: Codec, user_stop: StopStringChecker
) -> None:
    """Apply the rules after a segment (or before the first): insert, finish, or leave the row to sample on."""
    decision: Insert | Finish | None = None
    if segment is not None:
        for rule in rules:  # every rule observes (to keep its state), the first decision wins
            said = rule.observe(row, segment, codec)
            decision = said if decision is None else decision
        if decision is None and segment.ended == "eos":
            row.done = True
            return
        if decision is None and segment.ended == "stop" and user_stop and any(user_stop.check([segment.tokens])):
            row.done = row.stopped_by_string = True
            return
    while True:
        if isinstance(decision, Finish):
            row.done, row.truncated = True, decision.truncated
            return
        if isinstance(decision, Insert) and not _insert(row, decision, codec):
            return
        if row.budget_left <= 0:
            row.done = row.truncated = True
            return
        decision = next((rule.at_cap(row, codec) for rule in rules if rule.cap(row) == 0), None)
        if decision is None:
            return


def _insert(row: RowState, insert: Insert, codec: Codec) -> bool:
    """Append the inserted tokens; False (and the row ends, truncated) when the budget cut them short."""
    tokens = list(insert.token_ids) if insert.token_ids is not None else codec.encode(insert.text or "")
    if insert.max_tokens is not None:
        tokens = tokens[: insert.max_tokens]
    fits = len(tokens) <= row.budget_left
    tokens = tokens[: row.budget_left]
    row.tokens += tokens
    row.sources += [insert.source] * len(tokens)
    row.log_probs += [0.0] * len(tokens)
    if not fits:
        row.done = row.truncated = True
    return fits


def _assemble(rows: Sequence[RowState], pad_token_id: int, device: torch.device) -> GenerationOutput:
    width = max([len(row.tokens) for row in rows] + [1])
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    source = torch.zeros((len(rows), width), dtype=torch.long)
    log_probs = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, row in enumerate(rows):
        if row.tokens:
            ids[i, : len(row.tokens)] = torch.as_tensor(row.tokens, dtype=torch.long)
            source[i, : len(row.tokens)] = torch.as_tensor(row.sources, dtype=torch.long)
            log_probs[i, : len(row.tokens)] = torch.as_tensor(row.log_probs, dtype=torch.float32)
    mask = (source == TokenSource.SAMPLED).float()
    return GenerationOutput(
        response_ids=ids.to(device),
        response_mask=mask.to(device),
        truncated=torch.tensor([row.truncated for row in rows], dtype=torch.bool, device=device),
        log_probs=(log_probs * mask).to(device),
        stopped_by_string=torch.tensor([row.stopped_by_string for row in rows], dtype=torch.bool, device=device),
        seconds=0.0,
        response_source=source.to(device),
    )


def _turn_stats(rows: Sequence[RowState]) -> dict[str, float]:
    """Turns per response (runs of the policy's tokens between tool observations, as `Rollout.num_turns`)."""
    turns = []
    for row in rows:
        own = [s != TokenSource.TOOL for s in row.sources]
        turns.append(sum(1 for i, o in enumerate(own) if o and (i == 0 or not own[i - 1])))
    inserted = sum(1 for row in rows for s in row.sources if s != TokenSource.SAMPLED)
    num = max(len(rows), 1)
    return {
        "turns/mean": sum(turns) / num,
        "turns/max": float(max(turns, default=0)),
        "inserted_tokens/mean": inserted / num,
    }


def decode_responses(
    tokenizer: Any, out: GenerationOutput, stop_strings: Sequence[str]
) -> tuple[torch.Tensor, list[str]]:
    """Response lengths (`float[N]`, inserted tokens included) and texts of a backend's or `generate_segments`'
    output; a row stopped by a stop string is cut after it, looking only at its last turn's text."""
    if out.response_source is None:
        lengths = out.response_mask.sum(-1)
        starts = [0] * len(lengths)
    else:
        lengths = (out.response_source != TokenSource.PAD).float().sum(-1)
        sampled = out.response_source == TokenSource.SAMPLED
        after_insert = ~sampled & (out.response_source != TokenSource.PAD)
        # the last turn starts after the last inserted token
        positions = torch.arange(out.response_source.shape[1], device=after_insert.device)
        starts = torch.where(after_insert, positions + 1, 0).max(-1).values.tolist()
    rows = out.response_ids.tolist()
    heads = tokenizer.batch_decode(
        [row[:start] for row, start in zip(rows, starts, strict=True)], skip_special_tokens=True
    )
    tails = tokenizer.batch_decode(
        [row[start : int(length)] for row, start, length in zip(rows, starts, lengths.tolist(), strict=True)],
        skip_special_tokens=True,
    )
    if stop_strings:
        stop = StopStringChecker(stop_strings, tokenizer.batch_decode)
        hits = out.stopped_by_string.tolist()
        tails = [stop.cut(tail)[0] if hit else tail for tail, hit in zip(tails, hits, strict=True)]
    return lengths, [head + tail for head, tail in zip(heads, tails, strict=True)]

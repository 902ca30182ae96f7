"""What a generation backend returns, the stop-string rule every backend applies, and the stats of an output."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from torch import Tensor


class StopStringChecker:
    """Does the decoded tail of a row's response contain one of the stop strings?"""

    def __init__(
        self,
        stop_strings: Sequence[str],
        decode: Callable[[list[list[int]]], list[str]],
        may_end: Callable[[int], bool] | None = None,
    ):
        self.stop_strings = [s for s in stop_strings if s]
        self.decode = decode
        # False for a token that cannot complete a stop string: its row is not decoded (`stop_strings.py`)
        self.may_end = may_end or (lambda token_id: True)
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
    row_info: list[dict] | None = None  # per row: what segment rules add to the rollout's metadata


def generation_stats(out: GenerationOutput, lengths: Tensor, prompt_mask: Tensor, num_rows: int) -> dict[str, float]:
    """The numbers a policy reports after sampling (`last_generation_stats`); `lengths` are the response lengths."""
    generated = float(out.response_mask.sum().item())  # sampled tokens (inserted ones are not generated)
    stats = {
        "response_length/mean": float(lengths.mean().item()),
        "response_length/min": float(lengths.min().item()),
        "response_length/max": float(lengths.max().item()),
        "prompt_length/mean": float(prompt_mask.sum(-1).float().mean().item()),
        "truncated_fraction": float(out.truncated.float().mean().item()),
        "stop_string_fraction": float(out.stopped_by_string.float().mean().item()),
        "generation_seconds": out.seconds,
        "tokens_per_second": generated / max(out.seconds, 1e-9),
        "num_rows": float(num_rows),
    }
    if out.prefill_seconds is not None:
        stats["prefill_seconds"] = out.prefill_seconds
    if out.steps is not None:
        stats["generation_steps"] = float(out.steps)
    stats.update(out.stats)
    return stats

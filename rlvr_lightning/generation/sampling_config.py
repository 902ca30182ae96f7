"""`SamplingConfig`: how responses are sampled, the options every generation backend reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from rlvr_lightning.runtime.option_domains import NON_NEGATIVE_INT, POSITIVE_INT, Range, check_ranges


@dataclass
class SamplingConfig:
    """How responses are sampled. Log-probs are computed at the same temperature.

    Args:
        temperature: the sampling temperature (> 0); the trainer's log-probs use the same one.
        do_sample: false: greedy decoding (evaluation).
        top_p: nucleus sampling's probability mass (1: off).
        top_k: sample among the k most likely tokens (0: off).
        max_new_tokens: the most tokens a response may have.
        min_new_tokens: EOS is not sampled before this many tokens (equal-length benchmarks).
        stop_strings: a response ends after any of these strings.
    """

    temperature: float = 1.0
    do_sample: bool = True
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    min_new_tokens: int = 0
    stop_strings: list[str] = field(default_factory=list)

    OPTION_RANGES: ClassVar[dict[str, Range]] = {
        "temperature": Range(0, low_open=True),
        "top_p": Range(0, 1, low_open=True),
        "top_k": NON_NEGATIVE_INT,
        "max_new_tokens": POSITIVE_INT,
        "min_new_tokens": NON_NEGATIVE_INT,
    }

    def __post_init__(self) -> None:
        check_ranges(self.OPTION_RANGES, vars(self), prefix="sampling.")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(f"sampling.min_new_tokens must be in [0, max_new_tokens], got {self.min_new_tokens}")

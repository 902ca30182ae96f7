"""`SamplingConfig`: how responses are sampled, the options every generation backend reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import NON_NEGATIVE_INT, POSITIVE_INT, Range


@documented_options
@dataclass
class SamplingConfig:
    """How responses are sampled. Log-probs are computed at the same temperature."""

    temperature: Annotated[
        float,
        Option("the sampling temperature (> 0); the trainer's log-probs use the same one.", Range(0, low_open=True)),
    ] = 1.0
    do_sample: Annotated[bool, Option("false: greedy decoding (evaluation).")] = True
    top_p: Annotated[float, Option("nucleus sampling's probability mass (1: off).", Range(0, 1, low_open=True))] = 1.0
    top_k: Annotated[int, Option("sample among the k most likely tokens (0: off).", NON_NEGATIVE_INT)] = 0
    min_p: Annotated[
        float,
        Option("drop the tokens less likely than min_p times the likeliest (min-p sampling; 0: off).", Range(0, 1)),
    ] = 0.0
    max_new_tokens: Annotated[int, Option("the most tokens a response may have.", POSITIVE_INT)] = 256
    min_new_tokens: Annotated[
        int, Option("EOS is not sampled before this many tokens (equal-length benchmarks).", NON_NEGATIVE_INT)
    ] = 0
    stop_strings: Annotated[list[str], Option("a response ends after any of these strings.")] = field(
        default_factory=list
    )

    def __post_init__(self) -> None:
        check_options(SamplingConfig, vars(self), "sampling.")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(f"sampling.min_new_tokens must be in [0, max_new_tokens], got {self.min_new_tokens}")

    @property
    def filters(self) -> bool:
        """Whether sampling draws from a truncated distribution (top-k, top-p or min-p)."""
        return self.do_sample and (self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0)

    def check_group_size(self, group_size: int) -> None:
        if not self.do_sample and group_size > 1:
            raise ValueError(
                f"sampling.do_sample=false decodes greedily: the {group_size} responses of a group would be "
                "identical and every group-relative advantage 0. Sample (do_sample: true) or use group_size: 1."
            )

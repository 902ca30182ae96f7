"""The aggregation option group (`aggregation:`), in the form of `modules/options.py`'s groups: how per-token losses
become the scalar that is back-propagated (`core/aggregation.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from rlvr_lightning.core.aggregation import AGGREGATION_MODES
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import OneOf, Range


@documented_options
@dataclass(frozen=True)
class AggregationConfig:
    """How per-token losses become the scalar that is back-propagated (`core/aggregation.py`)."""

    mode: Annotated[
        str,
        Option(
            "seq-mean-token-mean (GRPO) | token-mean (DAPO) | seq-mean-token-sum | seq-sum-constant (Dr. GRPO) | "
            "prompt-mean-token-mean (ScaleRL: the mean over prompts of each prompt's token mean over its responses) | "
            "delta-l (ΔL Normalization: each response's token sum weighted by its length to the power -alpha, "
            "normalised over the mini-batch, divided by constant).",
            OneOf(AGGREGATION_MODES),
        ),
    ] = "seq-mean-token-mean"
    constant: Annotated[
        float | None,
        Option(
            "the divisor of seq-sum-constant and delta-l (null: the policy's fixed response_length if it has "
            "one, else sampling.max_new_tokens).",
            Range(0, low_open=True, optional=True),
        ),
    ] = None
    alpha: Annotated[
        float,
        Option(
            "delta-l's exponent: a response weighs |o|^-alpha (1: the least variance; 0: seq-sum-constant over the "
            "rows with tokens; the authors' default 0.75 weighs long responses more than 1 does).",
            Range(0),
        ),
    ] = 0.75
    count_empty_rows: Annotated[
        bool,
        Option(
            "whether responses without a token count in the seq-mean modes' divisor, and prompts without one in the "
            "prompt-mean mode's (verl: false)."
        ),
    ] = True
    mask_truncated: Annotated[
        bool,
        Option(
            "responses that hit max_new_tokens without ending leave the loss: their tokens count in no sum or "
            "divisor, and in the seq-mean modes they are empty rows (DAPO's overlong filtering; TRL's "
            "mask_truncated_completions). Their rewards still count in the advantages."
        ),
    ] = False
    mask_zero_variance_groups: Annotated[
        bool,
        Option(
            "the responses of prompts whose rewards all agree leave the loss as mask_truncated's do (ScaleRL's "
            "zero-variance filtering; unlike dynamic_sampling nothing is sampled in their place): their "
            "advantage under a group baseline is 0, so what changes is the divisors (with count_empty_rows: false "
            "the seq-mean and prompt-mean ones too) and their KL and entropy terms."
        ),
    ] = False

    def __post_init__(self) -> None:
        check_options(AggregationConfig, vars(self), "aggregation.")
        if self.constant is not None and self.mode not in ("seq-sum-constant", "delta-l"):
            raise ValueError(
                f"aggregation.constant is the divisor of modes 'seq-sum-constant' and 'delta-l', not of {self.mode!r}"
            )
        if self.alpha != 0.75 and self.mode != "delta-l":
            raise ValueError(f"aggregation.alpha is the exponent of mode 'delta-l', not of {self.mode!r}")

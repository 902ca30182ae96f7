"""`RepetitionPenalty`: a penalty for repeated n-grams, the degenerate text that length shaping can reward.

Yeo et al. 2025 ("Demystifying Long Chain-of-Thought Reasoning in LLMs", arXiv:2502.03373, §4.3 and Appendix
C.2) found models trained with a length-dependent reward learning to repeat themselves to reach a length; the
fraction of a response's n-grams that repeat an earlier one, times ``max_penalty``, discourages it:

    penalty = (1 - unique n-grams / n-grams) * max_penalty       (0 for a response shorter than n)

over token ids (``unit: tokens``, as TRL's ``get_repetition_penalty_reward``) or over the lower-cased words of
the decoded text (``unit: words``, as the authors' sparse penalty).

    trainer:
      callbacks:
        - class_path: rlvr_lightning.rewards.MathAccuracyReward
        - class_path: rlvr_lightning.rewards.RepetitionPenalty
          init_args: {ngram_size: 3, max_penalty: -1.0}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import torch
from torch import Tensor

from rlvr_lightning.rewards.base import RewardCallback
from rlvr_lightning.rollout import Rollout, TokenSource
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import POSITIVE_INT, OneOf, Range

REPETITION_UNITS = ("tokens", "words")


def repetition_penalty(units: Sequence[Any], ngram_size: int, max_penalty: float) -> float:
    """The penalty of one response given as its tokens or words (see the module docstring)."""
    ngrams = list(zip(*(units[i:] for i in range(ngram_size)), strict=False))
    if not ngrams:
        return 0.0
    # (1 - |unique n-grams| / |n-grams|) * max_penalty  (Yeo et al. 2025, arXiv:2502.03373, Appendix C.2;
    # the authors' get_repetition_penalty, eddycmu/demystify-long-cot e90cf9b; TRL _RepetitionPenalty)
    return (1.0 - len(set(ngrams)) / len(ngrams)) * max_penalty


@documented_options
class RepetitionPenalty(RewardCallback):
    """The share of a response's n-grams that repeat an earlier one, times ``max_penalty`` (a shaping reward)."""

    kind = "shaping"

    def __init__(
        self,
        ngram_size: Annotated[int, Option("n, the length of the repeated sequences.", POSITIVE_INT)] = 3,
        max_penalty: Annotated[
            float, Option("the penalty of a response that is one n-gram over and over.", Range(high=0))
        ] = -1.0,
        unit: Annotated[
            str,
            Option("what an n-gram is made of: tokens (ids) | words (of the decoded text).", OneOf(REPETITION_UNITS)),
        ] = "tokens",
        weight: float = 1.0,
        name: str | None = None,
        on_error: str = "zero",
    ) -> None:
        check_options(RepetitionPenalty, locals())
        super().__init__(weight=weight, name=name or "repetition_penalty", on_error=on_error)
        self.ngram_size, self.max_penalty, self.unit = ngram_size, max_penalty, unit

    def score(self, rollout: Rollout) -> Tensor:
        if self.unit == "words" and rollout.response_text is None:
            raise ValueError(
                "RepetitionPenalty(unit='words') needs decoded responses; this policy has none: use tokens"
            )
        return torch.tensor([self._penalty(rollout, i) for i in range(rollout.num_rows)], dtype=torch.float32)

    def _penalty(self, rollout: Rollout, i: int) -> float:
        if self.unit == "words":
            units = rollout.response_text[i].lower().split()
        elif rollout.response_source is None:
            units = rollout.response_ids[i][rollout.response_mask[i].bool()].tolist()
        else:
            units = rollout.response_ids[i][rollout.response_source[i] != TokenSource.PAD].tolist()
        return repetition_penalty(units, self.ngram_size, self.max_penalty)


__all__ = ["REPETITION_UNITS", "RepetitionPenalty", "repetition_penalty"]

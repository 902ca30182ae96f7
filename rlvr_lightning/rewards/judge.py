"""`GenerativeJudgeReward`: a local language model reads each response and says what it is worth.

    trainer:
      callbacks:
        - class_path: rlvr_lightning.rewards.judge.GenerativeJudgeReward
          init_args:
            judge:                                   # its own model: never the trained policy
              class_path: rlvr_lightning.policies.hf.HFPolicy
              init_args: {model: {name_or_path: smollm2-135m-instruct}, prompt: {template: chat}}
            template: "Is this review positive or negative? Answer with one word.\\n\\nReview: {response}"
            labels: {positive: 1.0, negative: 0.0}   # or a number: pattern, min_score, max_score
            batch_size: 8
            batch_timeout_s: 120

For each row the `template` is filled in (``{response}``: the response text; ``{prompt}``: the prompt
as the policy saw it, its template included; any other ``{field}``: the row's ``metadata[field]``),
the judge generates a short answer to it (greedy, `max_new_tokens`; `batch_size` rows per call), and
the answer is parsed, never evaluated:

* with `labels`, the score of the label word that comes first in the answer (whole words, any case:
  "No, the review is not positive" is ``no``);
* else the first match of the regular expression `pattern` (its first group if it has one) read as a
  number, which must lie in [`min_score`, `max_score`]; it is mapped to [0, 1] unless `normalize` is off.

An answer that names no label or holds no number in range is a failed row (scored 0 and counted, see
`rewards.model_reward`). The response is untrusted text: the judge tokenizer's special tokens
(``<|im_end|>``, ...) spelled out in any inserted value are removed first, so it cannot close the
judge's turn and write the verdict itself (`rewards.judge_prompt`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from torch import nn

from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.policies.base import Policy
from rlvr_lightning.rewards.judge_prompt import JudgePrompt
from rlvr_lightning.rewards.model_reward import ModelReward
from rlvr_lightning.rollout import Rollout

DEFAULT_PATTERN = r"-?\d+(?:\.\d+)?"


def parse_score(
    output: str,
    labels: dict[str, float] | None = None,
    pattern: str | re.Pattern = DEFAULT_PATTERN,
    min_score: float = 0.0,
    max_score: float = 10.0,
    normalize: bool = True,
) -> float:
    """The score a judge's answer gives (module docstring); ValueError when it gives none."""
    shown = repr(output[:200])
    if labels:
        found = [
            (m.start(), -len(label), label)
            for label in labels
            if (m := re.search(rf"\b{re.escape(label)}\b", output, re.I))
        ]
        if not found:
            raise ValueError(f"judge answer {shown} names none of {sorted(labels)}")
        return float(labels[min(found)[2]])  # the earliest; at one place the longest ("no way" over "no")
    match = re.search(pattern, output)
    if match is None:
        raise ValueError(f"judge answer {shown} has no score (pattern {getattr(pattern, 'pattern', pattern)!r})")
    value = float(match.group(1) if match.re.groups else match.group(0))
    if not math.isfinite(value) or not min_score <= value <= max_score:
        raise ValueError(f"judge score {value} from {shown} is outside [{min_score}, {max_score}]")
    return (value - min_score) / (max_score - min_score) if normalize else value


class GenerativeJudgeReward(ModelReward):
    """A language model judges each response through a prompt template (see the module docstring)."""

    def __init__(
        self,
        judge: Policy,
        template: str,
        labels: dict[str, float] | None = None,
        pattern: str = DEFAULT_PATTERN,
        min_score: float = 0.0,
        max_score: float = 10.0,
        normalize: bool = True,
        max_new_tokens: int = 16,
        **kwargs: Any,
    ) -> None:
        """
        Args:
            judge: the judging model, a `Policy` that samples text (an `HFPolicy` of its own; never the policy).
            template: the judge's prompt, with ``{response}`` and optionally ``{prompt}`` and metadata fields.
            labels: answer words and their scores (e.g. ``{positive: 1.0, negative: 0.0}``); None: a number.
            pattern: regular expression of the number in the judge's answer (its first group if it has one).
            min_score: the lowest number accepted; mapped to 0 when `normalize`.
            max_score: the highest number accepted; mapped to 1 when `normalize`.
            max_new_tokens: length of the judge's answer (greedy decoding).
            **kwargs: `ModelReward`'s options (`batch_size`, `batch_timeout_s`, `correct_threshold`) and
                `RewardCallback`'s (`weight`, `name`, `on_error`).
        """
        kwargs["name"] = kwargs.get("name") or "judge"
        super().__init__(**kwargs)
        if not isinstance(judge, nn.Module) or not hasattr(judge, "sample"):
            raise TypeError(f"judge must be a Policy that samples text (e.g. HFPolicy), got {type(judge).__name__}")
        if labels is not None and (not labels or not all(isinstance(k, str) and k.strip() for k in labels)):
            raise ValueError(f"labels must map non-empty words to scores (quote YAML's yes/no), got {labels!r}")
        if labels is None and not min_score < max_score:
            raise ValueError(f"min_score must be < max_score, got {min_score} and {max_score}")
        self.judge = judge
        self.prompt = JudgePrompt(template, getattr(judge, "tokenizer", None))  # every field is cleaned
        self.labels = dict(labels) if labels is not None else None
        self.pattern = re.compile(pattern)
        self.min_score, self.max_score, self.normalize = min_score, max_score, normalize
        self.sampling = SamplingConfig(do_sample=False, max_new_tokens=max_new_tokens)

    @property
    def scorer(self) -> nn.Module:
        return self.judge

    def score_rows(self, rollout: Rollout, rows: Sequence[int]) -> list[float | Exception]:
        prompts = [self.prompt(rollout, i) for i in rows]
        answers = self.judge.sample({"prompt": prompts, "metadata": [{} for _ in rows]}, 1, self.sampling).response_text
        results: list[float | Exception] = []
        for answer in answers:
            try:
                results.append(
                    parse_score(answer, self.labels, self.pattern, self.min_score, self.max_score, self.normalize)
                )
            except ValueError as error:
                results.append(error)
        return results


__all__ = ["DEFAULT_PATTERN", "GenerativeJudgeReward", "parse_score"]

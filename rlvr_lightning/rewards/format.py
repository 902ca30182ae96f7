"""Format rewards: does the response follow the required layout (whatever its answer)?

`R1FormatReward` checks the DeepSeek-R1 layout ``<think> ... </think> <answer> ... </answer>``:

* strict (default): the whole response is exactly one think block, then (after optional
  whitespace) exactly one non-empty answer block, and nothing else; no nested or repeated tags;
* lenient (``strict: false``): ``</think>`` appears and is followed, somewhere later, by
  ``<answer>`` and then ``</answer>`` (the check of Dr. GRPO's ``r1_zero_reward_fn``).

With the R1-Zero template the prompt already ends in ``<think>`` (see
`rlvr_lightning.data.templates`), so the response starts inside the think block; by default
(``think_in_prompt: null``) this is detected per row from ``rollout.prompt_text`` and the opening
tag is then taken as given.

`BoxedFormatReward` scores 1 when the response contains a ``\\boxed{...}`` with balanced, non-empty
content: the format signal of chat-template recipes that ask for a boxed answer.

Both have ``kind = "format"``: validation reports the share of responses with score 1 as the format rate.
All checks are linear-time string scans (model output is untrusted).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr_lightning.grading.answers import extract_boxed
from rlvr_lightning.rewards.base import RewardCallback
from rlvr_lightning.rewards.math import response_texts
from rlvr_lightning.rollout import Rollout

THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE = "<think>", "</think>", "<answer>", "</answer>"


def r1_format_ok(text: str, strict: bool = True, think_in_prompt: bool = False) -> bool:
    """Whether `text` follows ``<think> ... </think> <answer> ... </answer>`` (see the module docstring)."""
    if think_in_prompt and not text.lstrip().startswith(THINK_OPEN):
        text = THINK_OPEN + text
    if not strict:
        close = text.find(THINK_CLOSE)
        if close < 0:
            return False
        opening = text.find(ANSWER_OPEN, close + len(THINK_CLOSE))
        return opening >= 0 and text.find(ANSWER_CLOSE, opening + len(ANSWER_OPEN)) >= 0
    s = text.strip()
    if not s.startswith(THINK_OPEN) or not s.endswith(ANSWER_CLOSE):
        return False
    if any(s.count(tag) != 1 for tag in (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)):
        return False
    close = s.find(THINK_CLOSE)
    opening = s.find(ANSWER_OPEN)
    if not close < opening:
        return False
    if s[close + len(THINK_CLOSE) : opening].strip():
        return False  # text between the blocks
    return bool(s[opening + len(ANSWER_OPEN) : len(s) - len(ANSWER_CLOSE)].strip())


class R1FormatReward(RewardCallback):
    """1.0 when the response follows the R1 ``<think>``/``<answer>`` layout, else 0.0."""

    kind = "format"

    def __init__(
        self,
        strict: bool = True,
        think_in_prompt: bool | None = None,
        weight: float = 1.0,
        name: str | None = None,
        on_error: str = "zero",
    ) -> None:
        """
        Args:
            strict: exactly the layout and nothing else (True), or the lenient check (False).
            think_in_prompt: whether the prompt already opened the think block; None detects it per
                row (the rendered prompt ends in ``<think>``).
        """
        super().__init__(
            weight=weight, name=name or ("r1_format" if strict else "r1_format_lenient"), on_error=on_error
        )
        self.strict = strict
        self.think_in_prompt = think_in_prompt

    def _think_in_prompt(self, rollout: Rollout, i: int) -> bool:
        if self.think_in_prompt is not None:
            return self.think_in_prompt
        return bool(rollout.prompt_text) and rollout.prompt_text[i].rstrip().endswith(THINK_OPEN)

    def score(self, rollout: Rollout) -> Tensor:
        texts = response_texts(rollout, type(self).__name__)
        scores = [float(r1_format_ok(t, self.strict, self._think_in_prompt(rollout, i))) for i, t in enumerate(texts)]
        return torch.tensor(scores, dtype=torch.float32, device=rollout.response_ids.device)

    def is_correct(self, rollout: Rollout, scores: Tensor) -> Tensor:
        return scores >= 1.0


class BoxedFormatReward(RewardCallback):
    """1.0 when the response contains a ``\\boxed{...}`` with balanced, non-empty content, else 0.0."""

    kind = "format"

    def __init__(self, weight: float = 1.0, name: str | None = None, on_error: str = "zero") -> None:
        super().__init__(weight=weight, name=name or "boxed_format", on_error=on_error)

    def score(self, rollout: Rollout) -> Tensor:
        texts = response_texts(rollout, type(self).__name__)
        scores = [float(bool(extract_boxed(text))) for text in texts]
        return torch.tensor(scores, dtype=torch.float32, device=rollout.response_ids.device)

    def is_correct(self, rollout: Rollout, scores: Tensor) -> Tensor:
        return scores >= 1.0


__all__ = ["BoxedFormatReward", "R1FormatReward", "r1_format_ok"]

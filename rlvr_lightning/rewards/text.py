"""Plain-text rewards for demos and tests.

`ContainsReward` scores 1 when the response text contains a string: a fixed `target`, or the
example's own answer (`metadata[key]`, e.g. the `answer` of an `InlineTask` example).

    trainer:
      callbacks:
        - class_path: rlvr_lightning.rewards.text.ContainsReward
          init_args: {key: answer}
"""

from __future__ import annotations

from torch import Tensor

from rlvr_lightning.rewards.base import RewardCallback
from rlvr_lightning.rollout import Rollout


class ContainsReward(RewardCallback):
    """1.0 when the response contains `target` (or the row's `metadata[key]`), else 0.0."""

    def __init__(
        self,
        target: str | None = None,
        key: str | None = None,
        case_sensitive: bool = True,
        weight: float = 1.0,
        name: str | None = None,
        on_error: str = "zero",
    ) -> None:
        if (target is None) == (key is None):
            raise ValueError("ContainsReward needs exactly one of target= (a fixed string) or key= (a metadata key)")
        super().__init__(weight=weight, name=name, on_error=on_error)
        self.target = target
        self.key = key
        self.case_sensitive = case_sensitive

    def _wanted(self, rollout: Rollout, i: int) -> str:
        if self.target is not None:
            return self.target
        metadata = rollout.metadata[i] if rollout.metadata else {}
        if self.key not in metadata:
            raise KeyError(f"ContainsReward: row {i} has no metadata key {self.key!r} (keys: {sorted(metadata)})")
        return str(metadata[self.key])

    def score_row(self, rollout: Rollout, i: int) -> float:
        if rollout.response_text is None:
            raise ValueError("ContainsReward needs rollout.response_text (a language-model policy)")
        text, wanted = rollout.response_text[i], self._wanted(rollout, i)
        if not self.case_sensitive:
            text, wanted = text.lower(), wanted.lower()
        return float(wanted in text)

    def is_correct(self, rollout: Rollout, scores: Tensor) -> Tensor | None:
        return scores > 0


__all__ = ["ContainsReward"]

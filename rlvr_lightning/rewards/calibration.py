"""`CalibrationReward`, RLCR (Damani et al. 2025, "Beyond Binary Rewards: Training LMs to Reason About Their
Uncertainty", arXiv:2507.16806): the response states how confident it is that its answer is right, and a confidence
far from the answer's correctness costs its square.

A response states its confidence as a number in [0, 1] in a `<confidence>...</confidence>` tag (RLCR's format:
`<think>`, `<answer>`, `<analysis>`, `<confidence>`; ``pattern`` reads another; "0.85", ".85", "1" and "85%" are
read, the last statement counts). Its score is minus the Brier score,

    -(q - 1[correct])^2

so that with the task reward at weight 1 the total is RLCR's `1[correct] - (q - 1[correct])^2`
(`core/calibration.py`). Correctness is the task reward's (``correct_reward``: by default the first ``kind: task``
reward listed before this one). A response that states no confidence, or one outside [0, 1], scores
``-missing_penalty`` (1: the worst Brier score), so that leaving the confidence out never pays. Model output is
untrusted: the number is read by a regular expression and `float`, never evaluated.

Each step logs, under `train/rewards/<name>/` (and `val/rewards/<name>/` for a validation pass): `brier` (mean over
the responses that state a confidence), `ece` (expected calibration error over 10 equal-width bins), `auroc` (how
well the confidence tells right answers from wrong ones: 0.5 not at all; logged when both occur), `confidence` (the
mean stated) and `stated` (the share of responses that state one). With several responses per prompt and a
correctness reward that reads answers (`extract_answers`), also RLCR's test-time uses of the confidence, as the share
of prompts they solve: `vote_weighted` (the answer whose responses state the most confidence in total wins; ties:
the first seen) and `vote_max_confidence` (the answer of the response that states the most); `vote` is the plain
majority vote of the same responses, to compare with.

    trainer:
      callbacks:
        - class_path: rlvr_lightning.rewards.MathAccuracyReward
        - class_path: rlvr_lightning.rewards.CalibrationReward
"""

from __future__ import annotations

import math
import re
from typing import Annotated

import torch
from torch import Tensor

from rlvr_lightning.core.calibration import (
    auroc,
    brier_scores,
    calibration_bins,
    confidence_histogram,
    expected_calibration_error,
)
from rlvr_lightning.grading.answers import majority_vote
from rlvr_lightning.rewards.base import RewardCallback
from rlvr_lightning.rewards.length import CorrectnessShaping
from rlvr_lightning.rewards.math import response_texts
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import Range

CONFIDENCE_TAG = r"<confidence>\s*(.*?)\s*</confidence>"
_NUMBER = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(%?)")
ECE_BINS = 10
AUROC_LEVELS = 1000  # stated confidences are read to 1/1000


def parse_confidence(text: str, pattern: str | re.Pattern = CONFIDENCE_TAG) -> float | None:
    """The confidence the last match of `pattern` states (its first group: "0.85", ".85", "1", "85%"), or None when
    there is none or it is not a number in [0, 1]."""
    compiled = pattern if isinstance(pattern, re.Pattern) else re.compile(pattern, flags=re.DOTALL)
    matches = compiled.findall(text)
    if not matches:
        return None
    last = matches[-1]
    number = _NUMBER.fullmatch((last[0] if isinstance(last, tuple) else last).strip())
    if number is None:
        return None
    value = float(number.group(1)) / (100.0 if number.group(2) else 1.0)
    return value if math.isfinite(value) and 0.0 <= value <= 1.0 else None


def _checked_pattern(pattern: str) -> re.Pattern:
    try:
        compiled = re.compile(pattern, flags=re.DOTALL)
    except re.error as error:
        raise ValueError(f"CalibrationReward: pattern={pattern!r} is not a regular expression: {error}") from None
    if compiled.groups < 1:
        raise ValueError(
            f"CalibrationReward: pattern={pattern!r} has no group; its first group must capture the number "
            f"(the default: {CONFIDENCE_TAG!r})"
        )
    return compiled


@documented_options
class CalibrationReward(CorrectnessShaping):
    """Minus the Brier score of the confidence a response states, against the task reward's verdict (see the module
    docstring)."""

    def __init__(
        self,
        pattern: Annotated[
            str,
            Option("a regular expression whose first group captures the stated confidence (the last match counts)."),
        ] = CONFIDENCE_TAG,
        missing_penalty: Annotated[
            float,
            Option("what a response that states no confidence in [0, 1] loses (1: the worst Brier score).", Range(0)),
        ] = 1.0,
        correct_reward: str | None = None,
        correct_threshold: float = 1.0,
        weight: float = 1.0,
        name: str | None = None,
        on_error: str = "zero",
    ) -> None:
        check_options(CalibrationReward, locals())
        super().__init__(correct_reward, correct_threshold, weight=weight, name=name, on_error=on_error)
        self.pattern = pattern
        self._pattern = _checked_pattern(pattern)
        self.missing_penalty = missing_penalty
        self._trainer = None
        self._train, self._val = _CalibrationSums(), _CalibrationSums()

    def setup(self, trainer, pl_module, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._trainer = trainer

    def stated_confidences(self, rollout: Rollout) -> Tensor:
        """`[N]` each response's stated confidence, NaN where it states none in [0, 1]."""
        values = [parse_confidence(text, self._pattern) for text in response_texts(rollout, type(self).__name__)]
        return torch.tensor([math.nan if v is None else v for v in values], dtype=torch.float32)

    def score(self, rollout: Rollout) -> Tensor:
        confidence = self.stated_confidences(rollout)
        correct = self.correct(rollout).cpu()
        stated = ~confidence.isnan()
        penalty = torch.full_like(confidence, -self.missing_penalty)
        scores = torch.where(stated, -brier_scores(confidence.nan_to_num(0.0), correct), penalty)
        validating = self._trainer is not None and (self._trainer.validating or self._trainer.sanity_checking)
        sums = self._val if validating else self._train
        sums.update(confidence, correct)
        answers = self._answers(rollout) if rollout.group_size > 1 else None
        if answers is not None:
            sums.update_votes(vote_outcomes(answers, confidence, correct, rollout.group_size))
        return scores.to(rollout.response_ids.device)

    def _answers(self, rollout: Rollout) -> list[str | None] | None:
        """The answers the correctness reward reads from the responses, None where it reads none."""
        for callback in getattr(self._trainer, "callbacks", None) or ():
            if isinstance(callback, RewardCallback) and callback.name == self._resolved:
                return callback.extract_answers(rollout)
        return None

    def pop_metrics(self) -> dict[str, float]:
        return self._train.pop()

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._val.pop()

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        device = pl_module.device
        metrics = self._val.pop(lambda sums: trainer.strategy.reduce(sums.to(device), reduce_op="sum").cpu())
        if metrics:
            pl_module.log_dict({f"val/rewards/{self.name}/{key}": value for key, value in metrics.items()})


def vote_outcomes(answers: list[str | None], confidence: Tensor, correct: Tensor, group_size: int) -> Tensor:
    """`[4]`: the prompts, and those the plain majority vote, the confidence-weighted vote and the most confident
    response solve (a prompt is solved when a response with the chosen answer is correct; a response without a
    stated confidence weighs 0 and is chosen last)."""
    solved = torch.zeros(4)
    weights = confidence.nan_to_num(-1.0)
    for start in range(0, len(answers), group_size):
        group = answers[start : start + group_size]
        right = {a for a, ok in zip(group, correct[start : start + group_size].tolist(), strict=True) if ok}
        q = weights[start : start + group_size]
        chosen = (majority_vote(group), majority_vote(group, q.clamp_min(0).tolist()), group[int(q.argmax())])
        solved += torch.tensor([1.0] + [float(a is not None and a in right) for a in chosen])
    return solved


class _CalibrationSums:
    """The sums behind the metrics of the rows since the last `pop`; one flat vector, summed over ranks."""

    def __init__(self) -> None:
        self.bins = torch.zeros(ECE_BINS, 3)  # calibration_bins: rows, summed confidence, correct
        self.histogram = torch.zeros(AUROC_LEVELS + 1, 2)  # confidence_histogram: wrong, right
        self.totals = torch.zeros(3)  # rows, rows that state a confidence, summed Brier score
        self.votes = torch.zeros(4)  # vote_outcomes: prompts, solved by the plain, weighted and max-confidence choice

    def update(self, confidence: Tensor, correct: Tensor) -> None:
        stated = ~confidence.isnan()
        q, c = confidence[stated], correct[stated]
        self.bins += calibration_bins(q, c, ECE_BINS)
        self.histogram += confidence_histogram(q, c, AUROC_LEVELS)
        self.totals += torch.stack(
            (torch.tensor(float(confidence.numel())), stated.sum().float(), brier_scores(q, c).sum())
        )

    def update_votes(self, outcomes: Tensor) -> None:
        self.votes += outcomes

    def pop(self, reduce=None) -> dict[str, float]:
        """The metrics, with the sums first reduced (summed) over ranks by `reduce` where given; then zeroed."""
        parts = (self.bins, self.histogram, self.totals, self.votes)
        sums = torch.cat([part.flatten() for part in parts])
        if reduce is not None:
            sums = reduce(sums)
        bins, histogram, totals, votes = (
            chunk.view_as(part) for chunk, part in zip(sums.split([p.numel() for p in parts]), parts, strict=True)
        )
        for part in parts:
            part.zero_()
        rows, stated, brier = totals.tolist()
        if not rows:
            return {}
        metrics = {"stated": stated / rows}
        if stated:
            ece = float(expected_calibration_error(bins))
            metrics.update(brier=brier / stated, ece=ece, confidence=float(bins[:, 1].sum()) / stated)
            area = float(auroc(histogram))
            if math.isfinite(area):
                metrics["auroc"] = area
        prompts, plain, weighted, most_confident = votes.tolist()
        if prompts:
            metrics.update(
                vote=plain / prompts, vote_weighted=weighted / prompts, vote_max_confidence=most_confident / prompts
            )
        return metrics


__all__ = ["CONFIDENCE_TAG", "CalibrationReward", "parse_confidence", "vote_outcomes"]

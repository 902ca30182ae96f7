"""`MajorityVoteReward`: TTRL's label-free reward (Zuo et al. 2025, "TTRL: Test-Time Reinforcement Learning",
arXiv:2504.16084, sec. 2): 1 when a response's final answer equals the majority answer of its group, else 0.

    trainer:
      callbacks:
        - class_path: rlvr_lightning.rewards.MajorityVoteReward
          init_args: {methods: [boxed], numeric_only: true}
        - class_path: rlvr_lightning.rewards.MathAccuracyReward   # the ground truth, watched only
          init_args: {methods: [boxed], numeric_only: true, weight: 0.0}

The score reads no ground truth. Each response's answer is extracted as `MathAccuracyReward` extracts it; the
responses to one prompt (equal `group_index`) vote with their normalised answers, the most common wins (a tie goes
to the answer seen first, `grading.majority_vote`; a response without an answer does not vote), and every response
is judged against the winner by math-verify, as against a ground truth (`0.5` and `\\frac{1}{2}` agree). A prompt
none of whose responses has an answer scores 0 throughout.

Logged beside its mean (`train/rewards/majority_vote/...`): `majority_ratio`, the winner's share of its group's
responses (TTRL's), and with `answer_key`, `label_accuracy`, the share of prompts whose majority answer equals the
ground truth (TTRL's label accuracy; the ground truth is read for that alone). Validation's rows are not counted.

Agreement is not correctness, so the reward's `kind` is "shaping": validation accuracy, pass@k and maj@k come from
a task reward such as `MathAccuracyReward`, which a label-free run adds with `weight: 0` to watch how often the
majority is right (`train/rewards/math_accuracy`) without training on it. A vote needs several responses per
prompt: `group_size` 8 or more (TTRL votes over 64 and trains on the first 32: `group_filter: {keep: 32, metric:
first}`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

import torch
from torch import Tensor

from rlvr_lightning.grading.answers import DEFAULT_METHODS, majority_vote
from rlvr_lightning.rewards.math import MathAccuracyReward, metadata_values, response_texts
from rlvr_lightning.rollout import Rollout


def majority_labels(answers: Sequence[str | None], group_index: Sequence[int]) -> list[str | None]:
    """Each row's label: the majority answer among the rows with its `group_index`."""
    groups: dict[int, list[str | None]] = defaultdict(list)
    for answer, group in zip(answers, group_index, strict=True):
        groups[group].append(answer)
    winners = {group: majority_vote(votes) for group, votes in groups.items()}
    return [winners[group] for group in group_index]


class MajorityVoteReward(MathAccuracyReward):
    """1.0 when the response's final answer is mathematically equal to its group's majority answer, else 0.0."""

    kind = "shaping"

    def __init__(
        self,
        methods: Sequence[str] = DEFAULT_METHODS,
        timeout_s: float = 5.0,
        workers: int = 2,
        max_answer_chars: int = 2000,
        string_fast_path: bool = True,
        numeric_only: bool = False,
        answer_key: str | None = None,
        weight: float = 1.0,
        name: str | None = None,
        on_error: str = "zero",
    ) -> None:
        """
        Args:
            methods: answer extraction methods in order, from ``boxed``, ``answer_tag``, ``gsm8k``,
                ``answer_is``.
            timeout_s: wall-clock budget for judging one row.
            workers: math-verify worker processes.
            max_answer_chars: a longer extracted answer neither votes nor scores.
            string_fast_path: identical normalised strings score 1 without asking math-verify.
            numeric_only: only plain decimal numbers count as answers (vote and score).
            answer_key: the metadata field holding the ground truth, read only to log `label_accuracy` (null: not
                logged).
        """
        super().__init__(
            methods=methods,
            timeout_s=timeout_s,
            workers=workers,
            max_answer_chars=max_answer_chars,
            string_fast_path=string_fast_path,
            numeric_only=numeric_only,
            weight=weight,
            name=name or "majority_vote",
            on_error=on_error,
        )
        self.answer_key = answer_key  # MathAccuracyReward's ground truth: here only for the label accuracy
        self._clear_counts()

    def score(self, rollout: Rollout) -> Tensor:
        answers = self.extract_answers(rollout)
        group_index = rollout.group_index.tolist()
        labels = majority_labels(answers, group_index)
        # a response without an answer scores 0 unjudged (with numeric_only, math-verify would else judge the text)
        texts = [
            text if answer is not None else None
            for text, answer in zip(response_texts(rollout, type(self).__name__), answers, strict=True)
        ]
        scores, failed = self.verifier.score(texts, labels)
        self.num_errors += failed
        self._count(answers, labels, group_index, rollout)
        return torch.tensor(scores, dtype=torch.float32, device=rollout.response_ids.device)

    def _count(self, answers: list, labels: list, group_index: list[int], rollout: Rollout) -> None:
        """Add the batch's groups to the counts `pop_metrics` reports."""
        sizes = Counter(group_index)
        agree = Counter(
            g for g, a, label in zip(group_index, answers, labels, strict=True) if a is not None and a == label
        )
        self._ratio_sum += sum(agree[group] / size for group, size in sizes.items())  # TTRL's majority_ratio
        self._groups += len(sizes)
        if self.answer_key is None or not all(self.answer_key in (m or {}) for m in rollout.metadata):
            return
        golds = metadata_values(rollout, self.answer_key, type(self).__name__)
        first_rows = [group_index.index(group) for group in sizes]
        right, _ = self.verifier.score([labels[r] for r in first_rows], [golds[r] for r in first_rows], extract=False)
        self._labels_checked += len(first_rows)
        self._labels_right += int(sum(right))

    def _clear_counts(self) -> None:
        self._groups, self._ratio_sum, self._labels_checked, self._labels_right = 0, 0.0, 0, 0

    def pop_metrics(self) -> dict[str, float]:
        metrics = {}
        if self._groups:
            metrics["majority_ratio"] = self._ratio_sum / self._groups
        if self._labels_checked:
            metrics["label_accuracy"] = self._labels_right / self._labels_checked
        self._clear_counts()
        return metrics

    def on_validation_end(self, trainer, pl_module) -> None:
        self._clear_counts()  # validation's rows do not count in the training step's metrics

    def is_correct(self, rollout: Rollout, scores: Tensor) -> None:
        return None


__all__ = ["MajorityVoteReward", "majority_labels"]

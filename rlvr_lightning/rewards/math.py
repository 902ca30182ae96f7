"""`MathAccuracyReward`: 1 when the answer extracted from the response equals the ground truth, else 0.

    trainer:
      callbacks:
        - class_path: rlvr_lightning.rewards.math.MathAccuracyReward
          init_args: {answer_key: answer, methods: [boxed], timeout_s: 5.0}

The answer is extracted with `rlvr_lightning.grading.extract_answer` (by default the last
``\\boxed{}``, else the last ``<answer>`` tag, ``#### n`` or "the answer is ..."), and compared with
the row's ``metadata[answer_key]`` by math-verify in killable worker processes
(`rlvr_lightning.grading.MathVerifier`): ``1/2``, ``0.5`` and ``\\frac{1}{2}`` agree. A row whose
judging overruns ``timeout_s`` (``\\boxed{9^{9^{9^9}}}``) or crashes its worker scores 0 and is
counted in ``num_errors`` (logged as ``train/reward_errors/<name>``); the other rows are unaffected.

Equivalence is mathematical, so ``\\boxed{63 + 53}`` equals ``116``: a policy can learn to box the
question's expression instead of computing it (it does, within 20 steps, on 2-digit addition). For
tasks whose answer is a number, set ``numeric_only: true``: an answer that is not a plain decimal
number (``-12``, ``3.5``, ``1,000``, ``$5``) then scores 0 without being judged.

The workers start on the first batch (not at construction, so ``--print_config`` starts nothing)
and are stopped when the run ends (`teardown`) or fails (`on_exception`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import torch
from torch import Tensor

from rlvr_lightning.grading.answers import DEFAULT_METHODS, extract_answer, normalize_answer
from rlvr_lightning.rewards.base import RewardCallback
from rlvr_lightning.rollout import Rollout

log = logging.getLogger(__name__)

_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")


def is_plain_number(answer: str | None) -> bool:
    """Whether an extracted answer is a plain decimal number once normalised (``1,000`` and ``$5`` are)."""
    return bool(answer) and _NUMBER.fullmatch(normalize_answer(answer)) is not None


def response_texts(rollout: Rollout, reward: str) -> list[str]:
    if rollout.response_text is None:
        raise ValueError(f"{reward} needs rollout.response_text (a language-model policy such as HFPolicy)")
    return rollout.response_text


def metadata_values(rollout: Rollout, key: str, reward: str) -> list:
    """`metadata[i][key]` for every row; a missing key is a configuration error, reported once per batch."""
    values = []
    for i in range(rollout.num_rows):
        metadata = rollout.metadata[i] if rollout.metadata else {}
        if key not in metadata:
            raise KeyError(
                f"{reward}: row {i} has no metadata key {key!r} (keys: {sorted(metadata)}); "
                f"set the reward's key option to the task's ground-truth field"
            )
        values.append(metadata[key])
    return values


class MathAccuracyReward(RewardCallback):
    """1.0 when the response's final answer is mathematically equal to ``metadata[answer_key]``, else 0.0."""

    kind = "task"

    def __init__(
        self,
        answer_key: str = "answer",
        methods: Sequence[str] = DEFAULT_METHODS,
        timeout_s: float = 5.0,
        workers: int = 2,
        max_answer_chars: int = 2000,
        string_fast_path: bool = True,
        numeric_only: bool = False,
        weight: float = 1.0,
        name: str | None = None,
        on_error: str = "zero",
    ) -> None:
        """
        Args:
            answer_key: the metadata field holding the ground-truth answer.
            methods: answer extraction methods in order, from ``boxed``, ``answer_tag``, ``gsm8k``,
                ``answer_is`` (e.g. ``[boxed]`` to count only boxed answers).
            timeout_s: wall-clock budget for judging one row.
            workers: math-verify worker processes.
            max_answer_chars: longer extracted answers score 0 without being parsed.
            string_fast_path: identical normalised strings score 1 without asking math-verify.
            numeric_only: only plain decimal numbers count as answers (no expressions such as ``63 + 53``).
        """
        super().__init__(weight=weight, name=name or "math_accuracy", on_error=on_error)
        self.answer_key = answer_key
        self.methods = tuple(methods)
        extract_answer("x", self.methods)  # fail at construction on an unknown method
        self.timeout_s = timeout_s
        self.workers = workers
        self.max_answer_chars = max_answer_chars
        self.string_fast_path = string_fast_path
        self.numeric_only = numeric_only
        self._verifier = None

    # ------------------------------------------------------------------ verifier lifecycle

    @property
    def verifier(self):
        """The `MathVerifier`, created on first use."""
        if self._verifier is None:
            from rlvr_lightning.grading.math_equivalence import MathVerifier

            self._verifier = MathVerifier(
                workers=self.workers,
                timeout_s=self.timeout_s,
                extract=True,
                methods=self.methods,
                max_answer_chars=self.max_answer_chars,
                string_fast_path=self.string_fast_path,
            )
        return self._verifier

    def close(self) -> None:
        """Stop the worker processes (a later batch starts new ones)."""
        if self._verifier is not None:
            self._verifier.close()
            self._verifier = None

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self.close()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self.close()

    def __getstate__(self) -> dict:  # deep-copied / pickled without its processes
        state = dict(self.__dict__)
        state["_verifier"] = None
        return state

    # ------------------------------------------------------------------ scoring

    def score(self, rollout: Rollout) -> Tensor:
        texts = response_texts(rollout, type(self).__name__)
        golds = metadata_values(rollout, self.answer_key, type(self).__name__)
        golds = [None if gold is None else str(gold) for gold in golds]
        if self.numeric_only:  # a row whose answer is not a number is not judged (scores 0)
            texts = [t if is_plain_number(extract_answer(t, self.methods)) else None for t in texts]
        scores, failed = self.verifier.score(texts, golds)
        if failed:
            log.debug("%s: %d rows timed out or crashed their worker", self.name, failed)
        self.num_errors += failed
        return torch.tensor(scores, dtype=torch.float32, device=rollout.response_ids.device)

    def is_correct(self, rollout: Rollout, scores: Tensor) -> Tensor:
        return scores >= 1.0

    def extract_answers(self, rollout: Rollout) -> list[str | None]:
        """The normalised final answer of every response (None where there is none)."""
        answers: list[str | None] = []
        for text in response_texts(rollout, type(self).__name__):
            answer = extract_answer(text, self.methods)
            if answer is not None and (
                len(answer) > self.max_answer_chars or (self.numeric_only and not is_plain_number(answer))
            ):
                answer = None
            normalised = normalize_answer(answer) if answer else ""
            answers.append(normalised or None)
        return answers


__all__ = ["MathAccuracyReward", "is_plain_number"]

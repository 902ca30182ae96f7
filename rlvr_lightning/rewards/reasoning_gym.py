"""`ReasoningGymReward`: a reasoning-gym dataset's own scorer (`score_answer`) on the response's answer.

    trainer:
      callbacks:
        - class_path: rlvr_lightning.rewards.reasoning_gym.ReasoningGymReward
          init_args: {methods: [boxed, answer_tag]}

The answer is extracted from the response with `rlvr_lightning.grading.extract_answer` (`methods`, in order;
``"response"``: the whole response, stripped), then scored by ``score_answer(answer, entry)`` of the dataset the
row came from (``metadata["rg_dataset"]``, built with the row's ``metadata["rg_config"]``): reasoning-gym's
scores are in [0, 1], some with partial credit. A response is correct when it scores at least `correct_at`.
No answer scores 0. A scorer that raises, hangs past `timeout_s` or returns NaN fails its row only
(`RewardCallback`).

Per dataset the reward logs `train/<name>/<dataset>/reward` and `.../accuracy` every training step and
`val/<name>/<dataset>/reward` and `.../accuracy` every validation epoch (sums over ranks, then divided).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from rlvr_lightning.grading.answers import extract_answer
from rlvr_lightning.rewards.base import RewardCallback
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.distributed import log_to_loggers, reduce_across_ranks
from rlvr_lightning.runtime.optional_dependencies import require

RESPONSE = "response"


class ReasoningGymReward(RewardCallback):
    """The reasoning-gym scorer of each row's dataset, on the answer extracted from the response."""

    kind = "task"
    max_score = 1.0

    def __init__(
        self,
        methods: Sequence[str] = ("boxed", "answer_tag"),
        correct_at: float = 1.0,
        max_answer_chars: int = 2000,
        weight: float = 1.0,
        name: str | None = None,
        on_error: str = "zero",
        timeout_s: float | None = 10.0,
    ) -> None:
        """
        Args:
            methods: answer extraction methods, in order (`extract_answer`'s, or "response" for the whole
                response); the first that finds an answer wins.
            correct_at: a row scoring at least this is correct (accuracy, pass rates).
            max_answer_chars: longer answers score 0 without being scored.
        """
        super().__init__(weight=weight, name=name or "reasoning_gym", on_error=on_error, timeout_s=timeout_s)
        require("reasoning_gym", "ReasoningGymReward")
        self.methods = list(methods)
        extract_answer("x", [m for m in self.methods if m != RESPONSE])  # an unknown method fails here
        self.correct_at = correct_at
        self.max_answer_chars = max_answer_chars
        self._scorers: dict[tuple[str, str], Any] = {}
        self._val_sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        self._trainer = None

    # ------------------------------------------------------------------ scoring

    def extract(self, text: str | None) -> str | None:
        for method in self.methods:
            answer = (text or "").strip() or None if method == RESPONSE else extract_answer(text, [method])
            if answer:
                return answer
        return None

    def scorer(self, dataset: str, config: dict[str, Any]):
        """The dataset object whose `score_answer` judges rows of `dataset` built with `config` (cached)."""
        key = (dataset, repr(sorted(config.items())))
        if key not in self._scorers:
            from reasoning_gym.factory import DATASETS

            if dataset not in DATASETS:
                raise KeyError(f"{dataset!r} is not a reasoning-gym dataset")
            dataset_cls, config_cls = DATASETS[dataset]
            self._scorers[key] = dataset_cls(config=config_cls(**{**config, "size": 1}))
        return self._scorers[key]

    def score_row(self, rollout: Rollout, i: int) -> float:
        metadata = rollout.metadata[i]
        answer = self.extract(rollout.response_text[i])
        if answer is None or len(answer) > self.max_answer_chars:
            return 0.0
        entry = metadata["rg_entry"]
        score = self.scorer(metadata["rg_dataset"], metadata.get("rg_config", {})).score_answer(answer, entry)
        return float(score)

    def score(self, rollout: Rollout) -> Tensor:
        if rollout.response_text is None:
            raise ValueError(f"{self.name} needs rollout.response_text (a language-model policy such as HFPolicy)")
        scores = super().score(rollout)
        trainer = self._trainer
        if trainer is not None and trainer.validating and not trainer.sanity_checking:
            self._accumulate(self._val_sums, rollout, scores)
        return scores

    def is_correct(self, rollout: Rollout, scores: Tensor) -> Tensor:
        return scores >= self.correct_at

    def extract_answers(self, rollout: Rollout) -> list[str | None]:
        return [self.extract(text) for text in rollout.response_text]

    # ------------------------------------------------------------------ per-dataset metrics

    def _accumulate(self, sums: dict[str, list[float]], rollout: Rollout, scores: Tensor) -> None:
        for metadata, score in zip(rollout.metadata, scores.tolist(), strict=True):
            row = sums[metadata.get("rg_dataset", "unknown")]
            row[0] += score
            row[1] += float(score >= self.correct_at)
            row[2] += 1.0

    def _log(self, trainer, sums: dict[str, list[float]], prefix: str) -> None:
        """Sum reward, correct rows and rows per dataset over ranks; log their means."""
        datasets = sorted(self._datasets(trainer) | set(sums))
        names = [f"{d}/{k}" for d in datasets for k in ("reward", "correct", "rows")]
        values = torch.tensor(
            [sums.get(d, [0.0, 0.0, 0.0])[j] for d in datasets for j in range(3)], dtype=torch.float64
        )
        device = trainer.lightning_module.device if trainer.lightning_module is not None else "cpu"
        values = reduce_across_ranks(trainer, values.to(device), names, {n: "sum" for n in names}).cpu().tolist()
        metrics = {}
        for k, dataset in enumerate(datasets):
            reward, correct, rows = values[3 * k : 3 * k + 3]
            if rows:
                metrics[f"{prefix}/{self.name}/{dataset}/reward"] = reward / rows
                metrics[f"{prefix}/{self.name}/{dataset}/accuracy"] = correct / rows
        if metrics:
            log_to_loggers(trainer, metrics, trainer.fit_loop.epoch_loop._batches_that_stepped)
            # for callbacks and `rlvr eval`, which read the validation's metrics there
            trainer.callback_metrics.update({name: torch.tensor(value) for name, value in metrics.items()})

    @staticmethod
    def _datasets(trainer) -> set[str]:
        """Every dataset of the run's task, so that every rank reduces the same names."""
        task = getattr(getattr(trainer, "datamodule", None), "task", None)
        return set(getattr(task, "dataset_names", []))

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._trainer = trainer

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        rollout = getattr(pl_module, "last_rollout", None)
        if rollout is None or self.name not in rollout.rewards:
            return
        sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        self._accumulate(sums, rollout, rollout.rewards[self.name].cpu())
        self._log(trainer, sums, "train")

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._val_sums.clear()

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._log(trainer, self._val_sums, "val")
        self._val_sums.clear()


__all__ = ["ReasoningGymReward"]

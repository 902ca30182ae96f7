"""`ModelReward`: a reward computed by a local model that is not trained (a judge, a reward model).

What every model-judged reward shares:

* **Placement.** The scoring model belongs to the callback, not to the `LightningModule`: it is not
  among the trained parameters, not in the optimizer, not in the module's checkpoint, and never pushed
  to the policy's vLLM engine. `setup` freezes it and moves it to the trainer's device (each DDP rank
  holds its own copy), and refuses a scorer that shares parameters with the trained module.
* **Batches.** Rows are scored `batch_size` at a time (`score_rows`).
* **Failures cost their row.** `score_rows` returns a float or an exception per row (an output that
  cannot be parsed, a text too long for the scorer's context); a chunk that raises (`SystemExit` too) is
  scored again one row at a time, so one bad row cannot take its neighbours down. Failed rows, and rows
  scored with a value that is not a finite number, score 0 and are counted in `num_errors` (logged as
  `train/reward_errors/<name>`); `on_error: raise` stops the run instead.
* **A time budget per batch.** With `batch_timeout_s`, chunks are started only while the budget lasts;
  rows left when it is spent score 0 and are counted. A chunk already running is not interrupted
  (torch cannot be stopped half-way), so a batch overruns by at most one chunk, whose length
  `batch_size` (and a judge's `max_new_tokens`) bound.
"""

from __future__ import annotations

import logging
import time
from abc import abstractmethod
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from rlvr_lightning.rewards.base import RewardCallback, reraise
from rlvr_lightning.rollout import Rollout

log = logging.getLogger(__name__)


class ModelReward(RewardCallback):
    """Base class: subclasses give `scorer` (the model) and `score_rows` (see the module docstring)."""

    kind = "task"

    def __init__(
        self,
        batch_size: int = 8,
        batch_timeout_s: float | None = None,
        correct_threshold: float | None = None,
        weight: float = 1.0,
        name: str | None = None,
        on_error: str = "zero",
    ) -> None:
        """
        Args:
            batch_size: rows scored per forward pass (or generation call).
            batch_timeout_s: seconds for one rollout's rows; rows not started in time score 0 and are counted.
            correct_threshold: a response "solves the task" (validation accuracy, pass@k) when its score is at
                least this; None: this reward does not tell.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if batch_timeout_s is not None and batch_timeout_s <= 0:
            raise ValueError(f"batch_timeout_s must be > 0 or null, got {batch_timeout_s}")
        super().__init__(weight=weight, name=name, on_error=on_error, timeout_s=None)  # batch_timeout_s instead
        self.batch_size = batch_size
        self.batch_timeout_s = batch_timeout_s
        self.correct_threshold = correct_threshold
        self.num_timeouts = 0  # rows not scored within the budget, since the last `pop_errors` (part of num_errors)

    @property
    @abstractmethod
    def scorer(self) -> nn.Module:
        """The module holding the scoring model's weights."""

    @abstractmethod
    def score_rows(self, rollout: Rollout, rows: Sequence[int]) -> list[float | Exception]:
        """One score (or the reason it could not be scored) per row of `rows`; may raise for the whole chunk."""

    # ------------------------------------------------------------------ placement

    def setup(self, trainer, pl_module, stage: str) -> None:
        trained = {id(p) for p in pl_module.parameters()}
        if any(id(p) in trained for p in self.scorer.parameters()):
            raise ValueError(
                f"reward {self.name}: the scoring model shares parameters with the trained module; "
                "give the judge its own model (a separate `judge:`/`model_name_or_path:` entry), never the policy"
            )
        self.scorer.requires_grad_(False)
        self.scorer.to(trainer.strategy.root_device)

    # ------------------------------------------------------------------ scoring

    def score(self, rollout: Rollout) -> Tensor:
        scores = torch.full((rollout.num_rows,), self.failure_value)
        deadline = None if self.batch_timeout_s is None else time.monotonic() + self.batch_timeout_s
        rows = list(range(rollout.num_rows))
        for start in range(0, len(rows), self.batch_size):
            chunk = rows[start : start + self.batch_size]
            if self._out_of_time(deadline, rows[start:]):
                break
            try:
                results = self.score_rows(rollout, chunk)
                if len(results) != len(chunk):
                    raise RuntimeError(f"score_rows returned {len(results)} results for {len(chunk)} rows")
            except KeyboardInterrupt:
                raise
            except BaseException as error:  # SystemExit included: the scorer's code must not end the run
                if self.on_error == "raise" and isinstance(error, Exception):
                    raise
                log.debug("reward %s failed on rows %s; scoring them one at a time", self.name, chunk, exc_info=error)
                results = self._one_at_a_time(rollout, chunk, deadline)
            for i, result in zip(chunk, results, strict=True):
                if isinstance(result, BaseException):
                    if self.on_error == "raise":
                        reraise(result, self.name)
                    self.row_failed(i, result)
                else:
                    try:
                        scores[i] = float(result)
                    except Exception as error:  # not a number: the row fails, not the batch
                        if self.on_error == "raise":
                            raise
                        self.row_failed(i, error)
        return scores.to(rollout.response_ids.device)

    def _one_at_a_time(self, rollout: Rollout, chunk: list[int], deadline: float | None) -> list[float | BaseException]:
        results: list[float | BaseException] = []
        for position, i in enumerate(chunk):
            if deadline is not None and time.monotonic() >= deadline:
                self.num_timeouts += len(chunk) - position
                results += [TimeoutError(f"not scored within batch_timeout_s={self.batch_timeout_s}")] * (
                    len(chunk) - position
                )
                break
            try:
                results.append(self.score_rows(rollout, [i])[0])
            except KeyboardInterrupt:
                raise
            except BaseException as error:
                results.append(error)
        return results

    def _out_of_time(self, deadline: float | None, remaining: list[int]) -> bool:
        if deadline is None or time.monotonic() < deadline:
            return False
        message = (
            f"reward {self.name}: {len(remaining)} rows not scored within batch_timeout_s={self.batch_timeout_s} "
            "(scored 0)"
        )
        if self.on_error == "raise":
            raise TimeoutError(message)
        log.warning(message)
        self.num_errors += len(remaining)
        self.num_timeouts += len(remaining)
        return True

    def pop_errors(self) -> int:
        self.num_timeouts = 0
        return super().pop_errors()

    def is_correct(self, rollout: Rollout, scores: Tensor) -> Tensor | None:
        return None if self.correct_threshold is None else scores >= self.correct_threshold


__all__ = ["ModelReward"]

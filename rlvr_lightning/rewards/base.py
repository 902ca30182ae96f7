"""`RewardCallback`: a verifiable reward, plugged in as a Lightning callback.

The training module finds every `RewardCallback` in `trainer.callbacks`, calls each on
the step's `Rollout`, stores the unweighted scores in `rollout.rewards[name]` and the
weighted sum in `rollout.reward`. A new reward is one small subclass:

    class EndsWithSeven(RewardCallback):
        def score_row(self, rollout, i):
            return float(rollout.response_ids[i, -1] == 7)

and four lines of YAML under `trainer.callbacks`.

Model output is untrusted input. A reward that raises on one row costs that row (scored
0, counted in `num_errors`) when `on_error="zero"`; `on_error="raise"` stops the run.
The first failure prints one warning line (the error and where it was raised; the traceback
is logged at DEBUG level); later ones are summarised every `error_summary_every_n_steps`
training steps.
`timeout_s` bounds each `score_row` call: a row that takes longer scores 0 and is counted.
The call runs in a daemon thread, which Python cannot stop, so a row stuck in a tight loop
keeps one thread busy until the process exits; rewards that judge untrusted programs or
formulas (`rewards.code`, `rewards.math`) therefore run them in killable worker processes.
"""

from __future__ import annotations

import logging
import re
import threading
import traceback
from pathlib import Path

import torch
from lightning.pytorch import Callback
from lightning.pytorch.utilities import rank_zero_only
from torch import Tensor

from rlvr_lightning.rollout import Rollout

log = logging.getLogger(__name__)
_warn = rank_zero_only(log.warning)

ON_ERROR_CHOICES = ("zero", "raise")


def _snake_case(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class RewardCallback(Callback):
    """Base class. Override `score` (whole batch, vectorised) or `score_row` (one row at a time).

    `kind` says what `is_correct` means for evaluation: "task" (the response solves the task:
    validation accuracy, pass@k) or "format" (the response follows the required format:
    validation format rate); "shaping" rewards (length, penalties) report neither.
    """

    kind: str = "task"
    error_summary_every_n_steps: int = 50

    def __init__(
        self, weight: float = 1.0, name: str | None = None, on_error: str = "zero", timeout_s: float | None = None
    ) -> None:
        if on_error not in ON_ERROR_CHOICES:
            raise ValueError(f"on_error={on_error!r} is not one of {ON_ERROR_CHOICES}")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0 or null, got {timeout_s}")
        self.weight = weight
        self.name = name or _snake_case(type(self).__name__.removesuffix("Reward"))
        self.on_error = on_error
        self.timeout_s = timeout_s
        self.num_errors = 0  # rows that raised or timed out since the last `pop_errors`
        self._first_error: str | None = None  # the first exception this reward raised, described in one line
        self._warned = False
        self._failed_since_summary = self._rows_since_summary = self._failed_total = 0

    def score(self, rollout: Rollout) -> Tensor:
        """Unweighted scores `float[N]`. The default calls `score_row` on every row, isolating failures."""
        scores = torch.zeros(rollout.num_rows)
        for i in range(rollout.num_rows):
            try:
                scores[i] = float(self._score_row_in_time(rollout, i))
            except Exception as error:
                if self.on_error == "raise":
                    raise
                self.num_errors += 1
                self._first_error = self._first_error or f"row {i}: {describe_error(error)}"
                log.debug("reward %s failed on row %d", self.name, i, exc_info=True)
        return scores.to(rollout.response_ids.device)

    def _score_row_in_time(self, rollout: Rollout, i: int) -> float:
        if self.timeout_s is None:
            return self.score_row(rollout, i)
        result: list = []

        def run() -> None:
            try:
                result.append(self.score_row(rollout, i))
            except BaseException as error:  # handed to the caller below
                result.append(error)

        worker = threading.Thread(target=run, name=f"reward-{self.name}-row-{i}", daemon=True)
        worker.start()
        worker.join(self.timeout_s)
        if not result:
            raise TimeoutError(f"reward {self.name} took longer than timeout_s={self.timeout_s} on row {i}")
        if isinstance(result[0], BaseException):
            raise result[0]
        return result[0]

    def score_row(self, rollout: Rollout, i: int) -> float:
        raise NotImplementedError(f"{type(self).__name__} must override score() or score_row()")

    def is_correct(self, rollout: Rollout, scores: Tensor) -> Tensor | None:
        """`bool[N]`: which responses solve the task outright (validation accuracy); None if this reward cannot tell."""
        return None

    def extract_answers(self, rollout: Rollout) -> list[str | None] | None:
        """The final answer each response commits to (for majority voting).

        None if this reward has no notion of one."""
        return None

    def __call__(self, rollout: Rollout) -> Tensor:
        """`score` with whole-batch failures isolated as well (every row 0 and counted)."""
        errors_before = self.num_errors
        try:
            scores = self.score(rollout).float()
        except Exception as error:
            if self.on_error == "raise":
                raise
            self._first_error = self._first_error or f"the whole batch: {describe_error(error)}"
            log.debug("reward %s failed on the whole batch", self.name, exc_info=True)
            self.num_errors += rollout.num_rows
            scores = torch.zeros(rollout.num_rows, device=rollout.response_ids.device)
        self._note_failures(self.num_errors - errors_before, rollout.num_rows)
        return scores

    def _note_failures(self, failed: int, rows: int) -> None:
        """One warning at the first failure; after it, failures accumulate for the periodic summary."""
        self._rows_since_summary += rows
        if failed <= 0:
            return
        self._failed_total += failed
        if self._warned:
            self._failed_since_summary += failed
            return
        self._warned = True
        self._rows_since_summary = 0
        first = f" (first: {self._first_error})" if self._first_error else " (failed or timed out)"
        _warn(
            f"reward {self.name}: {failed} of {rows} rows scored 0{first}; counted in reward_errors/{self.name}. "
            f"on_error: raise stops the run instead; later failures are summarised every "
            f"{self.error_summary_every_n_steps} steps"
        )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        step = trainer.fit_loop.epoch_loop._batches_that_stepped + 1
        if self._failed_since_summary and step % self.error_summary_every_n_steps == 0:
            _warn(
                f"reward {self.name}: {self._failed_since_summary} of {self._rows_since_summary} rows scored 0 "
                f"in the last {self.error_summary_every_n_steps} steps ({self._failed_total} since the start)"
            )
            self._failed_since_summary = self._rows_since_summary = 0

    def pop_errors(self) -> int:
        errors, self.num_errors = self.num_errors, 0
        return errors


def describe_error(error: BaseException) -> str:
    """`TypeError: message (file.py:12)`: the error and the line that raised it, in one line."""
    text = f"{type(error).__name__}: {error}".strip().replace("\n", " ")
    text = text if len(text) <= 200 else text[:197] + "..."
    frames = traceback.extract_tb(error.__traceback__)
    return f"{text} ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else text


def find_reward_callbacks(callbacks) -> list[RewardCallback]:
    """The run's `RewardCallback`s (from `trainer.callbacks`), checked to have unique names."""
    rewards = [cb for cb in callbacks if isinstance(cb, RewardCallback)]
    names = [cb.name for cb in rewards]
    if len(set(names)) != len(names):
        raise ValueError(f"reward names must be unique, got {names}; set `name:` on the duplicates")
    return rewards

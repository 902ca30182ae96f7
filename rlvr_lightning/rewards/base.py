"""`RewardCallback`: a verifiable reward, plugged in as a Lightning callback.

The training module finds every `RewardCallback` in `trainer.callbacks`, calls each on
the step's `Rollout`, stores the unweighted scores in `rollout.rewards[name]` and the
weighted sum in `rollout.reward`. A new reward is one small subclass:

    class EndsWithSeven(RewardCallback):
        def score_row(self, rollout, i):
            return float(rollout.response_ids[i, -1] == 7)

and four lines of YAML under `trainer.callbacks`.

Model output is untrusted input, and so is what a reward makes of it. A row fails when the reward
raises on it (any exception but `KeyboardInterrupt`: `SystemExit` too), runs out of time or scores
it with a value that is not a finite number; a failed row scores `failure_value` (0) and is counted in
`num_errors` when `on_error="zero"`; `on_error="raise"` stops the run. A batched `score` that raises or
returns the wrong shape fails every row. The first failure prints one warning line (the error and where
it was raised; the traceback is logged at DEBUG level); later ones are summarised every
`error_summary_every_n_steps` training steps. A reward that fails on every row of its first training
step stops the run (`RewardFailedEveryRow`): that is a configuration mistake (a `score_row` with the
wrong signature, a missing metadata key), not bad luck.
`timeout_s` (default `DEFAULT_ROW_TIMEOUT_S`; null: none) bounds the `score_row` calls of a step: the rows
run concurrently in worker threads (`concurrent_rows` at a time, more when rows hang; 1 for a `score_row`
that is not thread-safe), and a row not scored within `timeout_s` of the start fails (`time_limit.py`), so a
step's scoring takes at most about one limit. Time-outs are counted in `num_timeouts` (logged as
`reward_errors/timeout`), the first one printed once; a reward that times out on every row of a step stops the
run (`RewardTimedOutEveryRow`): it never answers in time, which is a configuration mistake too.
"""

from __future__ import annotations

import logging
import re
import traceback
from pathlib import Path
from typing import NoReturn

import torch
from lightning.pytorch import Callback
from lightning.pytorch.utilities import rank_zero_only
from torch import Tensor

from rlvr_lightning.rewards.time_limit import is_row_timeout, results_in_time
from rlvr_lightning.rollout import Rollout

log = logging.getLogger(__name__)
_warn = rank_zero_only(log.warning)

ON_ERROR_CHOICES = ("zero", "raise")
DEFAULT_ROW_TIMEOUT_S = 60.0  # generous: a reward that calls a remote judge still fits; a stuck one is caught


class RewardFailedEveryRow(RuntimeError):
    """A reward failed on every row of its first training step: a configuration mistake, the run stops."""

    def __init__(self, reward: RewardCallback, rows: int) -> None:
        self.reward = reward
        cause = reward._first_error or "failed or timed out"
        super().__init__(f"reward {reward.name} failed on all {rows} rows of the first training step; first: {cause}")


class RewardTimedOutEveryRow(RewardFailedEveryRow):
    """A reward's time limit ran out before it scored any row of a step: it never answers in time, the run stops."""

    tip = "raise the reward's timeout_s (null: no limit), or fix what its score_row waits for"

    def __init__(self, reward: RewardCallback, rows: int) -> None:
        self.reward = reward
        RuntimeError.__init__(
            self,
            f"reward {reward.name} timed out on all {rows} rows of a step: none was scored within its "
            f"timeout_s={reward.timeout_s:g} s",
        )


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
    failure_value: float = 0.0  # the score of a failed row
    concurrent_rows: int = 8  # `score_row` calls at the same time, in threads (1: a reward that is not thread-safe)

    def __init__(
        self,
        weight: float = 1.0,
        name: str | None = None,
        on_error: str = "zero",
        timeout_s: float | None = DEFAULT_ROW_TIMEOUT_S,
    ) -> None:
        """
        Args:
            weight: the reward's weight in the total reward.
            name: its name in the logs (default: the class name in snake case without `Reward`).
            on_error: "zero": a failed row scores `failure_value` and is counted; "raise": it stops the run.
            timeout_s: seconds the `score_row` calls of a step may take, run concurrently (a row not scored by
                then fails); null: no limit, the rows run one after another in the caller's thread.
        """
        if on_error not in ON_ERROR_CHOICES:
            raise ValueError(f"on_error={on_error!r} is not one of {ON_ERROR_CHOICES}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 or null, got {timeout_s}")
        self.weight = weight
        self.name = name or _snake_case(type(self).__name__.removesuffix("Reward"))
        self.on_error = on_error
        self.timeout_s = timeout_s
        self.num_errors = 0  # rows that failed since the last `pop_errors`
        self.num_timeouts = 0  # of which: rows not scored within `timeout_s` (`pop_errors` resets both)
        self._first_error: str | None = None  # the first failure of this reward, described in one line
        self._first_timeout: str | None = None  # the row of its first time-out
        self._warned = self._warned_timeout = False
        self._failed_since_summary = self._rows_since_summary = self._failed_total = 0
        self._step_rows = self._step_failed = 0  # in the current training step
        self._first_step_checked = False

    def score(self, rollout: Rollout) -> Tensor:
        """Unweighted scores `float[N]`. The default calls `score_row` on every row (each within `timeout_s`),
        isolating failures."""
        scores = torch.zeros(rollout.num_rows)
        results = results_in_time(
            lambda i: self.score_row(rollout, i),
            rollout.num_rows,
            self.timeout_s,
            f"reward {self.name}",
            self.concurrent_rows,
        )
        for i, (returned, value) in enumerate(results):
            try:
                if not returned:
                    raise value
                scores[i] = float(value)
            except KeyboardInterrupt:
                raise
            except BaseException as error:  # SystemExit included: reward code must not end the run
                if self.on_error == "raise":
                    reraise(error, self.name)
                scores[i] = self.failure_value
                self.row_failed(i, error)
        return scores.to(rollout.response_ids.device)

    def row_failed(self, i: int, error: BaseException | str) -> None:
        """Count row `i` as failed; the first failure is kept for the warning (the traceback at DEBUG level)."""
        self.num_errors += 1
        if is_row_timeout(error):
            self.num_timeouts += 1
            self._first_timeout = self._first_timeout or f"row {i}"
        if self._first_error is None:
            self._first_error = f"row {i}: {error if isinstance(error, str) else describe_error(error)}"
        if isinstance(error, BaseException):
            log.debug("reward %s failed on row %d", self.name, i, exc_info=error)

    def score_row(self, rollout: Rollout, i: int) -> float:
        raise NotImplementedError(f"{type(self).__name__} must override score() or score_row()")

    def is_correct(self, rollout: Rollout, scores: Tensor) -> Tensor | None:
        """`bool[N]`: which responses solve the task outright (validation accuracy); None if this reward cannot tell."""
        return None

    def feedback(self, rollout: Rollout, scores: Tensor) -> list[str | None] | None:
        """What this reward can tell each response of the batch it just scored (`scores`) beyond its number, e.g.
        a failed test's error; read by SDPO's `SelfTeacher(feedback=true)`. None: nothing."""
        return None

    def extract_answers(self, rollout: Rollout) -> list[str | None] | None:
        """The final answer each response commits to (for majority voting).

        None if this reward has no notion of one."""
        return None

    def __call__(self, rollout: Rollout) -> Tensor:
        """`score`, checked: a whole-batch failure (it raised, or returned no `float[N]`) fails every row, and a
        score that is not a finite number fails its row."""
        errors_before, timeouts_before = self.num_errors, self.num_timeouts
        try:
            # a reward computed on the host joins the rollout's device (the GPU's), where the weighted sum is made
            scores = _as_scores(self.score(rollout), rollout.num_rows).to(rollout.response_ids.device)
        except KeyboardInterrupt:
            raise
        except BaseException as error:
            if self.on_error == "raise":
                reraise(error, self.name)
            self._first_error = self._first_error or f"the whole batch: {describe_error(error)}"
            log.debug("reward %s failed on the whole batch", self.name, exc_info=error)
            self.num_errors += rollout.num_rows
            scores = torch.full((rollout.num_rows,), self.failure_value, device=rollout.response_ids.device)
        scores = self._failing_non_finite(scores)
        timeouts = self.num_timeouts - timeouts_before if self.timeout_s is not None else 0  # of `timeout_s`
        self._note_failures(self.num_errors - errors_before, rollout.num_rows, timeouts)
        if rollout.num_rows and timeouts >= rollout.num_rows:
            raise RewardTimedOutEveryRow(self, rollout.num_rows)
        return scores

    def _failing_non_finite(self, scores: Tensor) -> Tensor:
        """+inf, -inf and NaN would turn every advantage of their group into 0 or NaN: each fails its row."""
        finite = torch.isfinite(scores)
        if bool(finite.all()):
            return scores
        rows = (~finite).nonzero().flatten().tolist()
        if self.on_error == "raise":
            raise ValueError(f"reward {self.name}: row {rows[0]} scored {scores[rows[0]].item()}, not a finite number")
        for i in rows:
            self.row_failed(i, f"scored {scores[i].item()}, not a finite number")
        return torch.where(finite, scores, torch.full_like(scores, self.failure_value))

    def _note_failures(self, failed: int, rows: int, timeouts: int = 0) -> None:
        """One warning at the first failure, and one at the first time-out; after them, failures accumulate for
        the periodic summary."""
        self._rows_since_summary += rows
        self._step_rows += rows
        self._step_failed += max(failed, 0)
        if failed <= 0:
            return
        self._failed_total += failed
        if timeouts and not self._warned_timeout:
            self._warned_timeout = True
            _warn(
                f"reward {self.name}: {timeouts} of {rows} rows not scored within timeout_s={self.timeout_s:g} s "
                f"(first: {self._first_timeout}); they score {self.failure_value:g}, counted in reward_errors/timeout "
                f"and reward_errors/{self.name}. The step's rows are scored concurrently; raise timeout_s (null: no "
                "limit) if the reward needs longer"
            )
            if failed == timeouts and not self._warned:  # that was the first failure's warning too
                self._warned = True
                self._rows_since_summary = 0
                return
        if self._warned:
            self._failed_since_summary += failed
            return
        self._warned = True
        self._rows_since_summary = 0
        first = f" (first: {self._first_error})" if self._first_error else " (failed or timed out)"
        _warn(
            f"reward {self.name}: {failed} of {rows} rows scored {self.failure_value:g}{first}; "
            f"counted in reward_errors/{self.name}. "
            f"on_error: raise stops the run instead; later failures are summarised every "
            f"{self.error_summary_every_n_steps} steps"
        )

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        self._step_rows = self._step_failed = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if not self._first_step_checked and self._step_rows:
            self._first_step_checked = True
            if self._step_failed >= self._step_rows:
                raise RewardFailedEveryRow(self, self._step_rows)
        step = trainer.fit_loop.epoch_loop._batches_that_stepped + 1
        if self._failed_since_summary and step % self.error_summary_every_n_steps == 0:
            _warn(
                f"reward {self.name}: {self._failed_since_summary} of {self._rows_since_summary} rows scored "
                f"{self.failure_value:g} in the last {self.error_summary_every_n_steps} steps "
                f"({self._failed_total} since the start)"
            )
            self._failed_since_summary = self._rows_since_summary = 0

    def pop_metrics(self) -> dict[str, float]:
        """What the reward measured of the rows it scored since the last call beyond their scores, logged as
        `{prefix}/rewards/<name>/<key>` (e.g. `MajorityVoteReward`'s label accuracy); none by default."""
        return {}

    def pop_errors(self) -> int:
        """The rows that failed since the last call (`num_errors`); resets `num_timeouts` too."""
        errors, self.num_errors, self.num_timeouts = self.num_errors, 0, 0
        return errors


def describe_error(error: BaseException) -> str:
    """`TypeError: message (file.py:12)`: the error and the line that raised it, in one line."""
    text = f"{type(error).__name__}: {error}".strip().replace("\n", " ")
    text = text if len(text) <= 200 else text[:197] + "..."
    frames = traceback.extract_tb(error.__traceback__)
    return f"{text} ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else text


def _as_scores(scores, num_rows: int) -> Tensor:
    """`float[num_rows]`, or ValueError: a `[N, 1]` result would broadcast against the other rewards' `[N]`."""
    scores = torch.as_tensor(scores).float()
    if tuple(scores.shape) != (num_rows,):
        raise ValueError(f"score returned shape {tuple(scores.shape)} for {num_rows} rows; expected ({num_rows},)")
    return scores


def reraise(error: BaseException, name: str) -> NoReturn:
    """`on_error: raise` raises an exception as it is; `SystemExit` and its kin, which would end the program
    without a word, as a RuntimeError that names the reward."""
    if isinstance(error, Exception):
        raise error
    raise RuntimeError(f"reward {name} raised {describe_error(error)}") from error


def find_reward_callbacks(callbacks) -> list[RewardCallback]:
    """The run's `RewardCallback`s (from `trainer.callbacks`), checked to have unique names."""
    rewards = [cb for cb in callbacks if isinstance(cb, RewardCallback)]
    names = [cb.name for cb in rewards]
    if len(set(names)) != len(names):
        raise ValueError(f"reward names must be unique, got {names}; set `name:` on the duplicates")
    if "timeout" in names:
        raise ValueError(
            "a reward cannot be named 'timeout' (reward_errors/timeout counts time-outs); set another name:"
        )
    return rewards

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
`timeout_s` bounds each `score_row` call: a row that takes longer scores 0 and is counted.
The call runs in a daemon thread, which Python cannot stop, so a row stuck in a tight loop
keeps one thread busy until the process exits; rewards that judge untrusted programs or
formulas (`rewards.code`, `rewards.math`) therefore run them in killable worker processes.
"""

from __future__ import annotations

import logging
import re
import threading

import torch
from lightning.pytorch import Callback
from torch import Tensor

from rlvr_lightning.rollout import Rollout

log = logging.getLogger(__name__)

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

    def score(self, rollout: Rollout) -> Tensor:
        """Unweighted scores `float[N]`. The default calls `score_row` on every row, isolating failures."""
        scores = torch.zeros(rollout.num_rows)
        for i in range(rollout.num_rows):
            try:
                scores[i] = float(self._score_row_in_time(rollout, i))
            except Exception:
                if self.on_error == "raise":
                    raise
                self.num_errors += 1
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
        """The final answer each response commits to (for majority voting), or None if this reward has no notion of one."""
        return None

    def __call__(self, rollout: Rollout) -> Tensor:
        """`score` with whole-batch failures isolated as well (every row 0 and counted)."""
        try:
            scores = self.score(rollout)
        except Exception:
            if self.on_error == "raise":
                raise
            log.warning("reward %s failed on the whole batch; scoring it 0", self.name, exc_info=True)
            self.num_errors += rollout.num_rows
            return torch.zeros(rollout.num_rows, device=rollout.response_ids.device)
        return scores.float()

    def pop_errors(self) -> int:
        errors, self.num_errors = self.num_errors, 0
        return errors


def find_reward_callbacks(callbacks) -> list[RewardCallback]:
    """The run's `RewardCallback`s (from `trainer.callbacks`), checked to have unique names."""
    rewards = [cb for cb in callbacks if isinstance(cb, RewardCallback)]
    names = [cb.name for cb in rewards]
    if len(set(names)) != len(names):
        raise ValueError(f"reward names must be unique, got {names}; set `name:` on the duplicates")
    return rewards

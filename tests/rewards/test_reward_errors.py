"""A failing reward is visible on the console: one concise warning the first time, a summary every
`error_summary_every_n_steps` steps after, never a traceback per step."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from rlvr_lightning.rewards import RewardCallback
from tests.rewards.test_sort_rewards import BrokenBatch, FailsOnOddRows, make_rollout

LOGGER = "rlvr_lightning.rewards.base"


def warnings_of(caplog) -> list[logging.LogRecord]:
    records = [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
    caplog.clear()
    return records


def end_steps(reward: RewardCallback, first: int, last: int) -> None:
    """Lightning's `on_train_batch_end` for rollout steps first..last (1-based)."""
    for step in range(first, last + 1):
        trainer = SimpleNamespace(fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(_batches_that_stepped=step - 1)))
        reward.on_train_batch_end(trainer, None, None, None, step - 1)


def test_row_failures_warn_once_then_are_summarised(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    rollout = make_rollout([[0, 1]] * 4, [[0, 1]] * 4)
    reward = FailsOnOddRows()
    reward(rollout)
    (first,) = warnings_of(caplog)
    assert first.getMessage().startswith(
        "reward fails_on_odd_rows: 2 of 4 rows scored 0 (first: row 1: RuntimeError: bad row (test_sort_rewards.py:"
    )
    assert "on_error: raise" in first.getMessage() and first.exc_info is None  # no traceback
    end_steps(reward, 1, 1)
    for step in range(2, 51):  # failures on every step: no new warning until the summary
        reward(rollout)
        end_steps(reward, step, step)
        if step < 50:
            assert warnings_of(caplog) == []
    (summary,) = warnings_of(caplog)
    assert (
        summary.getMessage()
        == "reward fails_on_odd_rows: 98 of 196 rows scored 0 in the last 50 steps (100 since the start)"
    )
    end_steps(reward, 51, 100)  # no failures since the summary: nothing to say
    assert warnings_of(caplog) == []


def test_a_batch_failure_warns_once_without_a_traceback(caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    rollout = make_rollout([[0, 1]] * 3, [[0, 1]] * 3)
    reward = BrokenBatch()
    for _ in range(3):
        assert reward(rollout).tolist() == [0.0, 0.0, 0.0]
    (warning,) = warnings_of_level(caplog, logging.WARNING)
    assert "3 of 3 rows scored 0 (first: the whole batch: ValueError: whole batch broken" in warning.getMessage()
    assert warning.exc_info is None
    assert reward.pop_errors() == 9  # still counted for the metric


def warnings_of_level(caplog, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno == level]


class CountsTimeouts(RewardCallback):
    """As the math and code rewards do: counts failed rows itself, no exception reaches the base class."""

    def score(self, rollout):
        self.num_errors += 1
        return rollout.response_ids.new_zeros(rollout.num_rows).float()


def test_failures_counted_by_the_reward_itself(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    CountsTimeouts()(make_rollout([[0, 1]] * 2, [[0, 1]] * 2))
    (warning,) = warnings_of(caplog)
    assert warning.getMessage().startswith("reward counts_timeouts: 1 of 2 rows scored 0 (failed or timed out)")

"""A reward's time limit bounds a step, not a row: the rows are scored concurrently, so a step where many rows
hang takes about one limit; the time-outs are counted (`reward_errors/timeout`), the first printed once; rows that
loop in Python past the limit are stopped; a reward that times out on every row of a step stops the run."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from rlvr_lightning.cli import entry_point
from rlvr_lightning.modules import scoring
from rlvr_lightning.rewards import RewardCallback
from rlvr_lightning.rewards.base import RewardTimedOutEveryRow, find_reward_callbacks
from tests.rewards.test_sort_rewards import make_rollout

LOGGER = "rlvr_lightning.rewards.base"
SORT = str(Path(__file__).resolve().parents[2] / "configs" / "sort_grpo.yaml")
LIMIT_S = 1.0
RELEASE = threading.Event()  # set when the module's tests end: no hanging row outlives them


@pytest.fixture(autouse=True, scope="module")
def release_hanging_rows():
    yield
    RELEASE.set()


class HangsOnAThird(RewardCallback):
    """Rows 0, 3, 6, ... hang, half of them blocked in a call (`Event.wait`), half looping in Python."""

    def score_row(self, rollout, i):
        if i % 3 == 0:
            if i % 2 == 0:
                RELEASE.wait(600)
            else:
                while not RELEASE.is_set():
                    pass
        return 1.0


def rows(n: int):
    return make_rollout([[0, 1]] * n, [[0, 1]] * n)


def reward_threads(name: str) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == f"reward-{name}"]


def test_a_step_where_a_third_of_the_rows_hang_takes_about_one_limit_not_one_per_row(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    reward = HangsOnAThird(timeout_s=LIMIT_S)
    started = time.monotonic()
    scores = reward(rows(24))
    elapsed = time.monotonic() - started
    assert scores.tolist() == [0.0 if i % 3 == 0 else 1.0 for i in range(24)]
    assert elapsed < 3 * LIMIT_S  # 8 hanging rows: one limit, not 8 (one after another)
    assert reward.num_timeouts == 8
    metrics = scoring.per_reward_metrics(type("Scored", (), {"rewards": {reward.name: scores}})(), [reward], "train")
    assert metrics["train/reward_errors/timeout"] == 8.0 and metrics["train/reward_errors/hangs_on_a_third"] == 8.0
    assert reward.num_timeouts == reward.num_errors == 0  # popped
    (warning,) = [record.getMessage() for record in caplog.records if record.name == LOGGER]
    assert warning.startswith(
        "reward hangs_on_a_third: 8 of 24 rows not scored within timeout_s=1 s (first: row 0); they score 0, "
        "counted in reward_errors/timeout and reward_errors/hangs_on_a_third."
    )
    reward(rows(24))
    assert len([record for record in caplog.records if record.name == LOGGER]) == 1  # printed once
    # the rows looping in Python were stopped; the ones blocked in a call end when it returns
    deadline = time.monotonic() + 10
    while len(reward_threads("hangs_on_a_third")) > 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(reward_threads("hangs_on_a_third")) == 8  # 4 blocked rows a step, two steps


class Sequential(RewardCallback):
    concurrent_rows = 1  # not thread-safe: one row at a time

    def score_row(self, rollout, i):
        self.threads = getattr(self, "threads", set()) | {threading.get_ident()}
        if i == 2:
            RELEASE.wait(600)
        return 1.0


def test_a_reward_that_is_not_thread_safe_scores_one_row_at_a_time_within_the_limit():
    reward = Sequential(timeout_s=LIMIT_S)
    started = time.monotonic()
    assert reward(rows(5)).tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]  # the rows after the hanging one wait: time-outs
    assert time.monotonic() - started < 3 * LIMIT_S
    assert len(reward.threads) == 1 and threading.get_ident() not in reward.threads


class AlwaysHangs(RewardCallback):
    def score_row(self, rollout, i):
        RELEASE.wait(600)
        return 1.0


def test_a_reward_that_times_out_on_every_row_of_a_step_stops_the_run():
    with pytest.raises(RewardTimedOutEveryRow, match="reward always_hangs timed out on all 6 rows of a step: none"):
        AlwaysHangs(timeout_s=0.2)(rows(6))
    with pytest.raises(ValueError, match="cannot be named 'timeout'"):
        find_reward_callbacks([AlwaysHangs(name="timeout")])


def test_the_command_line_says_which_reward_timed_out_and_where_it_is_configured(in_tmp_dir, capsys):
    extra = in_tmp_dir / "slow_reward.yaml"
    extra.write_text(
        "trainer:\n  callbacks:\n"
        "    - class_path: rlvr_lightning.rewards.SortInclusionOrderingReward\n"
        "    - class_path: tests.rewards.test_reward_time_limit.AlwaysHangs\n"
        "      init_args: {timeout_s: 0.5}\n"
    )
    args = ["fit", "--config", SORT, "--config", str(extra), "--trainer.logger=false"]
    args += ["--trainer.enable_progress_bar=false", "--trainer.num_sanity_val_steps=0"]
    args += ["--data.init_args.batch_size=4", "--model.init_args.update.mini_batch_size=32"]
    args += ["--model.init_args.dynamic_sampling.enabled=false"]
    code = entry_point(args)
    lines = capsys.readouterr().err.splitlines()
    errors = lines[next(i for i, line in enumerate(lines) if line.startswith("error:")) :]
    assert code == 2 and "Traceback" not in "\n".join(lines)
    assert errors[:3] == [
        "error: reward always_hangs timed out on all 32 rows of a step: none was scored within its timeout_s=0.5 s",
        f"  at trainer.callbacks[1] ({extra}:4)",
        "  raise the reward's timeout_s (null: no limit), or fix what its score_row waits for",
    ]

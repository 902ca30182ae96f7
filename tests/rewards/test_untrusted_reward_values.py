"""What a reward returns is untrusted: a value that is not a finite number, a `sys.exit`, a wrong shape or a
wrong `score_row` signature costs rows (scored 0, counted in reward_errors, the first cause printed once),
never a silent no-op or a silently dead run; a reward that fails on every row of the first step stops it."""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

from rlvr_lightning.advantages import GroupNormalizedAdvantage
from rlvr_lightning.cli.app import entry_point
from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.rewards import RewardCallback, SortInclusionOrderingReward
from rlvr_lightning.rewards.base import DEFAULT_ROW_TIMEOUT_S, RewardFailedEveryRow
from rlvr_lightning.rewards.model_reward import ModelReward
from tests.modules.test_rlvr_module import fit, policy
from tests.rewards.test_math_reward import make_rollout as text_rollout
from tests.rewards.test_sort_rewards import make_rollout

LOGGER = "rlvr_lightning.rewards.base"
SORT = str(Path(__file__).resolve().parents[2] / "configs" / "sort_grpo.yaml")
BAD_VALUES = [float("inf"), float("-inf"), float("nan")]
# the interpreter's sys.exit, read at collection: a W&B run (any earlier test's, in this process) replaces it for good
INTERPRETER_EXIT = sys.exit


class BatchedValue(RewardCallback):
    """`score`: 1 on every row, `value` on row 1."""

    def __init__(self, value: float, **kwargs):
        super().__init__(**kwargs)
        self.value = value

    def score(self, rollout):
        scores = torch.ones(rollout.num_rows)
        scores[1] = self.value
        return scores


class RowValue(BatchedValue):
    """`score_row`: the same, one row at a time."""

    score = RewardCallback.score

    def score_row(self, rollout, i):
        return self.value if i == 1 else 1.0


def rows(n: int = 4):
    return make_rollout([[0, 1]] * n, [[0, 1]] * n)


@pytest.mark.parametrize("value", BAD_VALUES, ids=str)
@pytest.mark.parametrize("reward_class", [BatchedValue, RowValue])
def test_a_non_finite_score_fails_its_row(reward_class, value, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    reward = reward_class(value)
    assert reward(rows()).tolist() == [1.0, 0.0, 1.0, 1.0]
    assert reward.pop_errors() == 1
    (warning,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert warning.startswith(f"reward {reward.name}: 1 of 4 rows scored 0 (first: row 1: scored {value}, not a finite")
    with pytest.raises(ValueError, match=f"reward {reward.name}: row 1 scored {value}, not a finite number"):
        reward_class(value, on_error="raise")(rows())


class Exits(RewardCallback):
    def score_row(self, rollout, i):
        if i == 2:
            sys.exit(3)
        return 1.0


class ExitsOnTheBatch(RewardCallback):
    def score(self, rollout):
        raise SystemExit("bye")


@pytest.mark.parametrize("timeout_s", [None, 5.0])
def test_sys_exit_in_reward_code_fails_the_row_not_the_run(timeout_s, caplog, monkeypatch):
    monkeypatch.setattr(sys, "exit", INTERPRETER_EXIT)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    reward = Exits(timeout_s=timeout_s)
    assert reward(rows()).tolist() == [1.0, 1.0, 0.0, 1.0] and reward.pop_errors() == 1
    assert "(first: row 2: SystemExit: 3 (test_untrusted_reward_values.py:" in caplog.records[0].getMessage()
    batch = ExitsOnTheBatch()
    assert batch(rows(3)).tolist() == [0.0] * 3 and batch.pop_errors() == 3
    with pytest.raises(RuntimeError, match="reward exits raised SystemExit: 3"):  # never a silent exit
        Exits(on_error="raise", timeout_s=timeout_s)(rows())


class Interrupted(RewardCallback):
    def score_row(self, rollout, i):
        raise KeyboardInterrupt


def test_keyboard_interrupt_still_stops():
    with pytest.raises(KeyboardInterrupt):
        Interrupted(timeout_s=None)(rows())


class WrongShape(RewardCallback):
    def score(self, rollout):
        return torch.ones(rollout.num_rows, 1)  # [N, 1] would broadcast the total reward to [N, N]


def test_a_batched_score_of_the_wrong_shape_fails_the_batch(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    reward = WrongShape()
    assert reward(rows(3)).tolist() == [0.0] * 3 and reward.pop_errors() == 3
    assert "score returned shape (3, 1) for 3 rows; expected (3,)" in caplog.records[0].getMessage()


class WhereAmI(RewardCallback):
    def score_row(self, rollout, i):
        self.thread = threading.current_thread()
        return 1.0


def test_user_rewards_get_a_generous_default_time_limit_that_can_be_turned_off():
    reward = WhereAmI()
    assert reward.timeout_s == DEFAULT_ROW_TIMEOUT_S >= 30
    reward(rows(1))
    assert reward.thread is not threading.main_thread()  # bounded: run in a thread the caller stops waiting for
    off = WhereAmI(timeout_s=None)
    off(rows(1))
    assert off.thread is threading.main_thread()
    with pytest.raises(ValueError, match="timeout_s must be > 0 or null"):
        WhereAmI(timeout_s=float("nan"))


class Judged(ModelReward):
    """A model-judged reward whose scorer returns `values` and exits on a row "exit"."""

    def __init__(self, values, **kwargs):
        super().__init__(**kwargs)
        self.values, self.model = values, nn.Linear(1, 1)

    @property
    def scorer(self):
        return self.model

    def score_rows(self, rollout, rows):
        if any(rollout.response_text[i] == "exit" for i in rows):
            sys.exit(1)
        return [self.values[i] for i in rows]


def test_model_judged_rewards_fail_rows_on_non_finite_values_and_sys_exit(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    reward = Judged([0.5, float("nan"), 0.25, float("inf"), 1.0], batch_size=2)
    scores = reward(text_rollout(["a", "b", "c", "d", "exit"]))
    assert scores.tolist() == [0.5, 0.0, 0.25, 0.0, 0.0]
    assert reward.pop_errors() == 3
    assert "3 of 5 rows scored 0 (first: row 4: SystemExit: 1" in caplog.records[0].getMessage()


# ----------------------------------------------------------------------------- in a training run


class NaNOnSomeRows(RewardCallback):
    """Row parity of the first response token; NaN where the first token is 0, +inf where it is 4."""

    def score(self, rollout):
        first = rollout.response_ids[:, 0]
        scores = (first % 2).float()
        return torch.where(first == 0, float("nan"), torch.where(first == 4, float("inf"), scores))


def test_non_finite_rows_in_a_run_are_counted_and_the_other_rows_still_train(in_tmp_dir):
    module = RLVRModule(policy(), group_size=4)
    before = [p.detach().clone() for p in module.parameters()]
    _, recorder = fit(module, [NaNOnSomeRows(name="nan_rows"), GroupNormalizedAdvantage()], steps=3, batch_size=8)
    assert len(recorder.steps) == 3
    assert sum(step["train/reward_errors/nan_rows"] for step in recorder.steps) > 0
    for step in recorder.steps:
        assert step["train/skipped_updates"] == 0 and torch.isfinite(torch.tensor(step["train/loss"]))
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, module.parameters(), strict=True))


class Infinite(RewardCallback):
    def score(self, rollout):
        return torch.full((rollout.num_rows,), float("inf"))


class WrongSignature(RewardCallback):
    def score_row(self, rollout):  # no `i`: fails on every row
        return 1.0


@pytest.mark.parametrize(
    ("reward", "cause"),
    [
        (WrongSignature(), "row 0: TypeError: WrongSignature.score_row() takes 2 positional arguments but 3 were"),
        (Infinite(), "row 0: scored inf, not a finite number"),
    ],
    ids=["wrong signature", "inf"],
)
def test_a_reward_failing_on_every_row_of_the_first_step_stops_the_run(reward, cause, in_tmp_dir):
    module = RLVRModule(policy(), group_size=4)
    with pytest.raises(RewardFailedEveryRow) as stopped:
        fit(module, [SortInclusionOrderingReward(), reward, GroupNormalizedAdvantage()], steps=3, batch_size=2)
    assert str(stopped.value).startswith(
        f"reward {reward.name} failed on all 8 rows of the first training step; first: {cause}"
    )
    assert module.trainer.global_step == 1  # stopped after the first step


def test_the_command_line_names_the_reward_and_where_it_is_configured(in_tmp_dir, capsys):
    extra = in_tmp_dir / "bad_reward.yaml"
    extra.write_text(
        "trainer:\n  callbacks:\n"
        "    - class_path: rlvr_lightning.rewards.SortInclusionOrderingReward\n"
        "    - class_path: rlvr_lightning.advantages.GroupNormalizedAdvantage\n"
        "    - class_path: tests.rewards.test_untrusted_reward_values.WrongSignature\n"
    )
    args = ["fit", "--config", SORT, "--config", str(extra), "--trainer.logger=false"]
    args += ["--trainer.enable_progress_bar=false", "--trainer.num_sanity_val_steps=0"]
    args += ["--data.init_args.batch_size=8", "--model.init_args.update.mini_batch_size=64"]
    args += ["--model.init_args.dynamic_sampling.enabled=false"]
    code = entry_point(args)
    lines = capsys.readouterr().err.splitlines()
    errors = lines[next(i for i, line in enumerate(lines) if line.startswith("error:")) :]
    assert code == 2 and "Traceback" not in "\n".join(lines)
    assert errors[0].startswith(
        "error: reward wrong_signature failed on all 64 rows of the first training step; first: row 0: TypeError: "
    )
    assert errors[1] == f"  at trainer.callbacks[2] ({extra}:5)"
    assert len(errors) <= 4

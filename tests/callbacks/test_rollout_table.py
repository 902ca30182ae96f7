"""RolloutTableLogger: W&B table when W&B is a logger, rich console table otherwise; every n steps."""

from __future__ import annotations

import math

import torch
from lightning.pytorch.loggers import Logger

from rlvr_lightning.callbacks.rollout_table import RolloutTableLogger, rollout_rows
from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.modules.options import DynamicSamplingConfig
from rlvr_lightning.modules.update.policy_update import PolicyUpdate
from rlvr_lightning.rewards.format import BoxedFormatReward
from rlvr_lightning.rewards.math import MathAccuracyReward
from tests.rewards.test_math_reward import ScriptedTextPolicy, make_rollout, run_trainer

RESPONSES = [r"\boxed{4}", r"\boxed{5}", "four", r"\boxed{4}"]
TRAIN = [{"prompt": f"What is {i} + 4 - {i}?", "answer": "4", "responses": RESPONSES} for i in range(6)]


class WandbLogger(Logger):
    """Stands in for lightning's WandbLogger (recognised by class name): records `log_table` calls."""

    def __init__(self):
        super().__init__()
        self.tables = []

    @property
    def name(self):
        return "fake"

    @property
    def version(self):
        return 0

    def log_metrics(self, metrics, step=None):
        pass

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_table(self, key, columns=None, data=None, step=None):
        self.tables.append({"key": key, "columns": columns, "data": data, "step": step})


def _module():
    torch.manual_seed(0)
    return RLVRModule(ScriptedTextPolicy(), group_size=4, optimizer=lambda p: torch.optim.SGD(p, lr=0.1))


def _rewards():
    return [MathAccuracyReward(methods=["boxed"]), BoxedFormatReward(weight=0.5)]


def test_wandb_table_every_n_steps(in_tmp_dir, capsys):
    logger = WandbLogger()
    table = RolloutTableLogger(every_n_steps=2, num_rows=4)
    module = _module()
    run_trainer(module, [*_rewards(), table], TRAIN, batch_size=2, steps=3, logger=logger)
    assert [t["data"][0][0] for t in logger.tables] == [1, 2]  # steps 1 and 2 (3 is not a multiple of 2)
    first = logger.tables[0]
    assert first["key"] == "rollouts"
    assert first["columns"] == [
        "step",
        "group",
        "prompt",
        "completion",
        "reward",
        "math_accuracy",
        "boxed_format",
        "advantage",
        "length",
    ]
    assert len(first["data"]) == 4  # one whole group of 4
    rows = {row[3]: row for row in first["data"]}
    assert set(rows) == set(RESPONSES)
    assert rows[r"\boxed{4}"][4:7] == [1.5, 1.0, 1.0] and rows["four"][4:7] == [0.0, 0.0, 0.0]
    assert rows[r"\boxed{4}"][7] > 0 > rows["four"][7]  # group-normalised advantages
    assert len({row[1] for row in first["data"]}) == 1  # whole groups
    assert "rollouts at step" not in capsys.readouterr().out  # W&B present: no console table
    assert "score" not in vars(module)  # teardown restored the module's own method


def test_console_table_without_wandb(in_tmp_dir, capsys):
    table = RolloutTableLogger(every_n_steps=1, num_rows=8, console_rows=2)
    run_trainer(_module(), [*_rewards(), table], TRAIN, batch_size=2, steps=1)
    out = capsys.readouterr().out
    assert "rollouts at step 1" in out
    assert "math_accuracy" in out and "advantage" in out
    assert out.count("What is") == 2  # console_rows


def test_rollout_rows_token_level_advantages_and_shortening():
    rollout = make_rollout(["x" * 50, "short"], group_size=2, lengths=[4, 2])
    rollout.rewards = {"r": torch.tensor([1.0, 0.0])}
    rollout.reward = torch.tensor([1.0, 0.0])
    rollout.advantages = torch.tensor([[1.0, 1.0, 2.0, 0.0], [-1.0, -3.0, 9.0, 9.0]])  # masked past each length
    columns, data = rollout_rows(rollout, [0, 1], max_chars=21)
    assert columns == ["group", "prompt", "completion", "reward", "r", "advantage", "length"]
    assert data[0][5] == 1.0 and data[1][5] == -2.0
    assert data[0][2] == "x" * 8 + " ... " + "x" * 8 and data[1][2] == "short"
    assert data[0][6] == 4 and data[1][6] == 2
    rollout.demonstration_rows = torch.tensor([False, True])  # LUFFY's groups: a column says which rows
    columns, data = rollout_rows(rollout, [1, 0])
    assert columns[-1] == "demonstration" and [row[-1] for row in data] == [True, False]


def test_rollout_rows_of_a_multi_turn_response():
    from rlvr_lightning.rollout import TokenSource

    rollout = make_rollout(["call obs answer"], group_size=1, lengths=[5])
    S, T = TokenSource.SAMPLED, TokenSource.TOOL
    rollout.response_source = torch.tensor([[S, T, T, S, S]])
    rollout.response_mask = (rollout.response_source == S).float()
    rollout.advantages = torch.tensor([[3.0, 100.0, 100.0, 3.0, 3.0]])  # observation positions carry no advantage
    columns, data = rollout_rows(rollout, [0])
    row = dict(zip(columns, data[0], strict=True))
    assert row["advantage"] == 3.0 and row["length"] == 5  # the length counts the observation


class _RecordingUpdate(PolicyUpdate):
    def run(self, rollout, module):
        module.trained = getattr(module, "trained", []) + [rollout]
        return super().run(rollout, module)


class TrainedBatchSpy(RLVRModule):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.policy_update = _RecordingUpdate(**self.policy_update.options())


def test_dynamic_sampling_logs_the_trained_batch(in_tmp_dir):
    # half the prompts are answered identically 4 times (zero variance): dynamic sampling drops their groups
    # and tops the batch up; the table must show the merged batch that was trained, with its advantages
    flat = [{"prompt": f"What is {i} + 1 - 1?", "answer": "1", "responses": [r"\boxed{1}"]} for i in range(6)]
    logger = WandbLogger()
    torch.manual_seed(0)
    module = TrainedBatchSpy(
        ScriptedTextPolicy(),
        group_size=4,
        dynamic_sampling=DynamicSamplingConfig(enabled=True),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
    )
    table = RolloutTableLogger(every_n_steps=1, num_rows=8)
    run_trainer(module, [*_rewards(), table], TRAIN + flat, batch_size=2, steps=3, logger=logger)
    assert len(logger.tables) == 3
    rounds = module.trainer.callback_metrics["train/dynamic_sampling/rounds"]
    for logged, trained in zip(logger.tables, module.trained, strict=True):
        advantages = [row[7] for row in logged["data"]]
        assert all(math.isfinite(a) for a in advantages), advantages
        expected = sorted(
            (p, c, round(float(a), 6))
            for p, c, a in zip(trained.prompt_text, trained.response_text, trained.advantages, strict=True)
        )
        assert sorted((row[2], row[3], round(row[7], 6)) for row in logged["data"]) == expected
    assert any(len(set(row[5] for row in t["data"])) > 1 for t in logger.tables)  # informative groups were trained
    assert rounds >= 1

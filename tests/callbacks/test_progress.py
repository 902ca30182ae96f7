"""Progress inside a step: the module reports its stages, a generation loop its tokens, the bar shows them."""

from __future__ import annotations

import io
import logging
import sys

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import CSVLogger

from rlvr_lightning.callbacks import progress as progress_callbacks
from rlvr_lightning.callbacks.progress import ProgressLines, RewardProgressBar, StageColumn
from rlvr_lightning.data import RLVRDataModule, SortTask
from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.modules.options import UpdateConfig
from rlvr_lightning.policies import ToySortPolicy
from rlvr_lightning.rewards import SortInclusionOrderingReward
from rlvr_lightning.runtime import stage_reports

TOKENS = 4


class DecodingSortPolicy(ToySortPolicy):
    """Reports one token per response position while sampling, as a generation loop does, and records
    what the progress bar would draw on the training row at each of them."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.seen: list[str] = []

    def sample(self, batch, n, sampling):
        for done in range(1, TOKENS + 1):
            stage_reports.report_tokens(done, TOKENS)
            for listener in stage_reports._listeners:
                if isinstance(listener, RewardProgressBar) and listener.train_progress_bar_id is not None:
                    self.seen.append(StageColumn(listener).render(listener.train_progress_bar).plain)
        return super().sample(batch, n, sampling)


class Stages:
    def __init__(self) -> None:
        self.events: list[str] = []

    def on_stage(self, stage: str) -> None:
        self.events.append(stage)

    def on_tokens(self, done: int, total: int) -> None:
        self.events.append(f"{done}/{total}")


def fit(callbacks, steps: int = 2, logger=False, **trainer_kwargs) -> tuple[pl.Trainer, RLVRModule]:
    torch.manual_seed(0)
    policy = DecodingSortPolicy(vocab_size=5, prompt_length=3, embedding_dim=8)
    module = RLVRModule(policy, group_size=4, update=UpdateConfig(epochs=2, mini_batch_size=16))
    data = RLVRDataModule(SortTask(vocab_size=5, length=3, num_val=0), batch_size=8)
    trainer = pl.Trainer(
        max_epochs=1,
        limit_train_batches=steps,
        limit_val_batches=0,
        logger=logger,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[SortInclusionOrderingReward(), *callbacks],
        **trainer_kwargs,
    )
    trainer.fit(module, datamodule=data)
    return trainer, module


def test_the_module_reports_its_stages_and_the_bar_shows_stage_and_tokens(in_tmp_dir):
    stages = Stages()
    bar = RewardProgressBar()
    with stage_reports.listening(stages):
        trainer, module = fit([bar], steps=2, logger=CSVLogger("logs"))
    one_step = ["generate", "1/4", "2/4", "3/4", "4/4", "score", "log-probs", "update"]
    assert stages.events == one_step * 2
    assert module.policy.seen == [f"generate {done}/{TOKENS} tokens" for done in range(1, TOKENS + 1)] * 2
    assert bar not in stage_reports._listeners  # removed at teardown
    assert "v_num" not in bar.get_metrics(trainer, module) and "reward" in bar.get_metrics(trainer, module)
    assert bar.status.text() == ""  # cleared between steps


def test_nothing_listens_by_default():
    assert stage_reports._listeners == []
    stage_reports.report_stage("generate")  # no listener: a no-op
    stage_reports.report_tokens(1, 2)


def test_progress_lines_without_a_bar(in_tmp_dir, capsys):
    fit([ProgressLines(every_s=0.0)], steps=2, enable_progress_bar=False)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("rlvr: rollout step")]
    assert lines[0].startswith("rlvr: rollout step 1 (epoch 0, batch 1/2), 0 s in: generate")
    assert any("generate 4/4 tokens" in line for line in lines) and any(line.endswith(": update") for line in lines)
    assert any(line.startswith("rlvr: rollout step 2 ") for line in lines)


def test_lightning_log_lines_go_above_a_live_bar(monkeypatch):
    """While Rich draws the bar, sys.stderr is its proxy; Lightning's handler must write there, and get its
    stream back."""
    handler = logging.StreamHandler(sys.__stderr__)
    logging.getLogger("lightning.pytorch").addHandler(handler)
    try:
        proxy = io.StringIO()
        monkeypatch.setattr(sys, "stderr", proxy)
        bar = RewardProgressBar()
        bar._reroute_log_handlers()
        assert handler.stream is proxy
        logging.getLogger("lightning.pytorch.loops").warning("`Trainer.fit` stopped")
        assert "`Trainer.fit` stopped" in proxy.getvalue()
        bar._stop_progress()
        assert handler.stream is sys.__stderr__
    finally:
        logging.getLogger("lightning.pytorch").removeHandler(handler)


def test_slow_steps_show_the_reward_after_every_step(in_tmp_dir, monkeypatch):
    """The metrics column is recomputed every 10 batches, or after any batch once it is a second old:
    a language-model step of a minute shows its reward at once (here every step counts as slow)."""
    monkeypatch.setattr(progress_callbacks, "METRICS_MAX_AGE_S", 0.0)
    bar = RewardProgressBar()
    seen = []

    class Peek(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.append(dict(bar._metric_component._metrics))

    fit([bar, Peek()], steps=3)
    assert "reward" not in seen[0] and "reward" in seen[1] and seen[1]["reward"] != seen[2]["reward"]

"""Resume from a checkpoint written exactly at an epoch boundary: the next epoch runs whole, once (a run whose
restored data position says "epoch exhausted" can otherwise skip the next epoch, or replay the finished one).

RL (the setup of tests/test_resume.py: 3 epochs of 4 rollout steps): the checkpoint written at the epoch end by
a `ModelCheckpoint(every_n_epochs=1)`, and the one `SaveOnInterrupt` writes after the epoch's last step; the
resumed run is bitwise the uninterrupted one. SFT over a finite file: the resumed run takes each later epoch's
steps exactly once.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import torch

from rlvr_lightning.cli.app import entry_point, main
from rlvr_lightning.data.sft_data import write_jsonl
from tests.modules.test_sft import sort_pairs
from tests.test_resume import EPOCHS, STEPS_PER_EPOCH, config, logged, parameters
from tests.test_run_checkpoints import INTERRUPTED, SendSigint

EPOCH_END = """    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args:
        {{dirpath: {dirpath}, every_n_epochs: 1, save_on_train_epoch_end: true, save_top_k: -1, filename: "{{epoch}}"}}
"""


def resume_matches_the_full_run(tmp_path: Path, full, checkpoint: Path) -> None:
    resumed_cfg = config(tmp_path, "resumed", False)
    (tmp_path / "ckpt_resumed").mkdir()
    shutil.copy(checkpoint, tmp_path / "ckpt_resumed" / "last.ckpt")
    resumed = main(["fit", "--config", str(resumed_cfg), "--ckpt_path", "last"])
    assert resumed.trainer.fit_loop.epoch_loop._batches_that_stepped == STEPS_PER_EPOCH * EPOCHS
    for key, value in parameters(full.model).items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key
    full_log, resumed_log = logged(tmp_path, "full"), logged(tmp_path, "resumed")
    assert sorted(resumed_log) == list(range(STEPS_PER_EPOCH, STEPS_PER_EPOCH * EPOCHS))  # none repeated or skipped
    assert resumed_log == {step: full_log[step] for step in resumed_log}


def test_rl_resume_from_the_checkpoint_of_an_epoch_end(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    full = main(["fit", "--config", str(config(tmp_path, "full", False, EPOCH_END.format(dirpath=tmp_path / "ends")))])
    assert sorted(p.name for p in (tmp_path / "ends").iterdir()) == [f"epoch={e}.ckpt" for e in range(EPOCHS)]
    resume_matches_the_full_run(tmp_path, full, tmp_path / "ends" / "epoch=0.ckpt")


def test_rl_resume_after_ctrl_c_in_the_last_step_of_an_epoch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    stop = f"    - class_path: {SendSigint.__module__}.SendSigint\n      init_args: {{step: {STEPS_PER_EPOCH - 1}}}\n"
    assert entry_point(["fit", "--config", str(config(tmp_path, "interrupted", False, stop))]) == INTERRUPTED
    full = main(["fit", "--config", str(config(tmp_path, "full", False))])
    resume_matches_the_full_run(tmp_path, full, tmp_path / "ckpt_interrupted" / "last.ckpt")


SFT = """
seed_everything: 0
trainer:
  max_epochs: 3
  limit_val_batches: 0
  enable_progress_bar: false
  enable_model_summary: false
  logger:
    - class_path: lightning.pytorch.loggers.CSVLogger
      init_args: {{save_dir: {tmp}/logs, name: {name}}}
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args:
        {{dirpath: {tmp}/ckpt_{name}, every_n_epochs: 1, save_top_k: -1, save_last: true, filename: "{{epoch}}"}}
model:
  class_path: rlvr_lightning.modules.SFTModule
  init_args:
    policy:
      class_path: rlvr_lightning.policies.ToySortPolicy
      init_args: {{vocab_size: 5, prompt_length: 3, embedding_dim: 8, activation: tanh}}
data:
  class_path: rlvr_lightning.data.SFTDataModule
  init_args: {{train_file: {tmp}/train.jsonl, batch_size: 8}}
"""


def sft_steps(tmp_path: Path, name: str) -> list[tuple[int, int]]:
    """(step, epoch) of every logged training step."""
    rows = [row for path in (tmp_path / "logs" / name).rglob("metrics.csv") for row in csv.DictReader(open(path))]
    return sorted({(int(row["step"]), int(row["epoch"])) for row in rows if row.get("epoch")})


def test_sft_resume_from_the_checkpoint_of_an_epoch_end(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_jsonl(sort_pairs(40), tmp_path / "train.jsonl")  # 5 steps an epoch
    for name in ("full", "resumed"):
        (tmp_path / f"{name}.yaml").write_text(SFT.format(tmp=tmp_path, name=name))
    main(["fit", "--config", str(tmp_path / "full.yaml")])
    (tmp_path / "ckpt_resumed").mkdir()
    shutil.copy(tmp_path / "ckpt_full" / "epoch=0.ckpt", tmp_path / "ckpt_resumed" / "last.ckpt")
    resumed = main(["fit", "--config", str(tmp_path / "resumed.yaml"), "--ckpt_path", "last"])
    assert resumed.trainer.global_step == 15
    assert sft_steps(tmp_path, "full") == [(step, step // 5) for step in range(15)]
    assert sft_steps(tmp_path, "resumed") == [(step, step // 5) for step in range(5, 15)]

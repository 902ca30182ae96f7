"""A distillation run resumed from a checkpoint ends bitwise where the uninterrupted run ends, with a teacher read
from a checkpoint file (`policy_from_checkpoint`) that the run's own checkpoints do not hold (tests/test_resume.py's
pattern, in one process: checkpoints every 2 rollout steps, resumed from step 4 of 8)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from rlvr_lightning.cli.app import main
from rlvr_lightning.policies.toy_sort import ToySortPolicy

from .test_resume import logged, parameters

STEPS = 8
POLICY = "{vocab_size: 5, prompt_length: 3, embedding_dim: 8, activation: relu}"


def config(tmp_path: Path, name: str, teacher: Path) -> Path:
    text = f"""
seed_everything: 3
trainer:
  max_epochs: 1
  limit_train_batches: {STEPS}
  limit_val_batches: 0
  enable_progress_bar: false
  enable_model_summary: false
  logger:
    - class_path: lightning.pytorch.loggers.CSVLogger
      init_args: {{save_dir: {tmp_path}/logs, name: {name}}}
  callbacks:
    - class_path: rlvr_lightning.rewards.SortInclusionOrderingReward
    - class_path: rlvr_lightning.advantages.GroupNormalizedAdvantage
    - class_path: rlvr_lightning.callbacks.RolloutCheckpoint
      init_args: {{dirpath: {tmp_path}/ckpt_{name}, every_n_rollout_steps: 2, save_last: true, save_top_k: -1}}
model:
  class_path: rlvr_lightning.modules.RLVRModule
  init_args:
    policy:
      class_path: rlvr_lightning.policies.ToySortPolicy
      init_args: {POLICY}
    teacher:
      class_path: rlvr_lightning.modules.policy_from_checkpoint
      init_args:
        checkpoint_path: {teacher}
        policy:
          class_path: rlvr_lightning.policies.ToySortPolicy
          init_args: {POLICY}
    distillation: {{coef: 1.0, rl_coef: 0.5}}
    optimizer:
      class_path: torch.optim.Adam
      init_args: {{lr: 0.03}}
    group_size: 4
    update: {{epochs: 2, mini_batch_size: 16}}
data:
  class_path: rlvr_lightning.data.RLVRDataModule
  init_args:
    batch_size: 8
    task:
      class_path: rlvr_lightning.data.SortTask
      init_args: {{vocab_size: 5, length: 3, num_val: 0, seed: 0}}
"""
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def test_a_resumed_distillation_run_is_bitwise_identical_and_its_checkpoints_hold_no_teacher(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(11)
    teacher = tmp_path / "teacher.pt"
    torch.save(ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=8, activation="relu").state_dict(), teacher)

    full = main(["fit", "--config", str(config(tmp_path, "full", teacher))])
    assert full.trainer.fit_loop.epoch_loop._batches_that_stepped == STEPS
    checkpoint = torch.load(tmp_path / "ckpt_full" / "epoch=0-rollout_step=4.ckpt", weights_only=False)
    assert not any(key.startswith("teacher") for key in checkpoint["state_dict"])
    assert "teacher" not in checkpoint["hyper_parameters"]

    (tmp_path / "ckpt_resumed").mkdir()
    shutil.copy(tmp_path / "ckpt_full" / "epoch=0-rollout_step=4.ckpt", tmp_path / "ckpt_resumed" / "last.ckpt")
    resumed = main(["fit", "--config", str(config(tmp_path, "resumed", teacher)), "--ckpt_path", "last"])
    assert resumed.trainer.fit_loop.epoch_loop._batches_that_stepped == STEPS
    expected, actual = parameters(full.model), parameters(resumed.model)
    assert expected.keys() == actual.keys()
    for key in expected:
        assert torch.equal(expected[key], actual[key]), key
    for key in ("train/teacher_kl", "train/reward_mean"):
        full_log, resumed_log = logged(tmp_path, "full", key), logged(tmp_path, "resumed", key)
        assert sorted(resumed_log) == list(range(4, STEPS))
        assert resumed_log == {step: full_log[step] for step in resumed_log}
    assert float(full_log[0]) != 0  # the teacher is not the student

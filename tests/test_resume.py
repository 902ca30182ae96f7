"""Exact resume: a run killed with SIGKILL and resumed from last.ckpt ends bitwise where an uninterrupted run ends.

The killed run is a real `rlvr fit` subprocess, stopped with SIGKILL from here while it waits at
the start of step K + 1; the uninterrupted and the resumed runs go through the same CLI in this
process. Every run trains 2K rollout steps of a small sort task with what a checkpoint must
carry: Adam state, an LR scheduler, a KL reference refreshed every 3 steps, random mini-batch
order, DAPO dynamic sampling (top-up prompts), validation that samples (consuming RNG) every 3
steps, and optionally the difficulty
filter refreshed every epoch of 4 steps. Checkpoints every 2 rollout steps, so last.ckpt is
step K = 6, in the middle of epoch 1.
"""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rlvr_lightning.cli.app import main

K = 6
STEPS_PER_EPOCH = 4
EPOCHS = 3  # 2K = 12 rollout steps
REPO = Path(__file__).resolve().parents[1]

KILLPOINT = '''
import os, time
import torch
from lightning.pytorch import Callback
torch.set_num_threads(1)

class WaitAtStep(Callback):
    """At the start of rollout step `step` (0-based), write `marker` and wait to be killed."""
    def __init__(self, step: int, marker: str):
        self.step, self.marker = step, marker
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.fit_loop.epoch_loop._batches_that_stepped == self.step:
            open(self.marker, "w").close()
            time.sleep(600)
'''

FILTER = """
    difficulty_filter:
      class_path: rlvr_lightning.data.DifficultyFilter
      init_args: {n: 4, max_candidates: 48, batch_size: 16, pass_threshold: 4.0}
"""


PPO = """    value: {model: shared, lr: 0.01, warmup_steps: 2}
    gae: {lam: 0.95}
"""


def config(tmp_path: Path, name: str, with_filter: bool, extra_callbacks: str = "", ppo: bool = False) -> Path:
    text = f"""
seed_everything: 3
trainer:
  max_epochs: {EPOCHS}
  limit_train_batches: {STEPS_PER_EPOCH}
  limit_val_batches: 1
  val_check_interval: 3
  check_val_every_n_epoch: null
  num_sanity_val_steps: 0
  enable_progress_bar: false
  enable_model_summary: false
  logger:
    - class_path: lightning.pytorch.loggers.CSVLogger
      init_args: {{save_dir: {tmp_path}/logs, name: {name}}}
  callbacks:
    - class_path: rlvr_lightning.rewards.SortInclusionOrderingReward
{"" if ppo else "    - class_path: rlvr_lightning.advantages.GroupNormalizedAdvantage"}
    - class_path: rlvr_lightning.callbacks.RolloutCheckpoint
      init_args: {{dirpath: {tmp_path}/ckpt_{name}, every_n_rollout_steps: 2, save_last: true, save_top_k: -1}}
{extra_callbacks}
model:
  class_path: rlvr_lightning.modules.{"PPOModule" if ppo else "RLVRModule"}
  init_args:
{PPO if ppo else ""}    policy:
      class_path: rlvr_lightning.policies.ToySortPolicy
      init_args: {{vocab_size: 5, prompt_length: 3, embedding_dim: 8, activation: relu}}
    optimizer:
      class_path: torch.optim.Adam
      init_args: {{lr: 0.03}}
    lr_scheduler:
      class_path: torch.optim.lr_scheduler.StepLR
      init_args: {{step_size: 5, gamma: 0.8}}
    group_size: 4
    update: {{epochs: 2, mini_batch_size: 16}}
    kl: {{coef: 0.05, refresh_every: 3}}
    validation: {{greedy: false, group_size: 2}}
    dynamic_sampling: {{enabled: true}}   # tops batches up with RLVRDataModule.topup_batch: those draws resume too
data:
  class_path: rlvr_lightning.data.RLVRDataModule
  init_args:
    batch_size: 8
    task:
      class_path: rlvr_lightning.data.SortTask
      init_args: {{vocab_size: 5, length: 3, num_val: 8, seed: 0}}
{FILTER if with_filter else ""}
"""
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def parameters(module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def logged(tmp_path: Path, name: str, key: str = "train/reward_mean") -> dict[int, str]:
    """step -> the logged value as written (repr of the float: equal strings are equal bits)."""
    values = {}
    for path in sorted((tmp_path / "logs" / name).rglob("metrics.csv")):
        with open(path) as f:
            for row in csv.DictReader(f):
                if row.get(key):
                    values[int(row["step"])] = row[key]
    return values


def start_killed_run(tmp_path: Path, name: str, with_filter: bool, ppo: bool = False) -> tuple[subprocess.Popen, Path]:
    (tmp_path / "killpoint.py").write_text(KILLPOINT)
    marker = tmp_path / f"{name}.waiting"
    waiter = f"""    - class_path: killpoint.WaitAtStep
      init_args: {{step: {K}, marker: {marker}}}"""
    cfg = config(tmp_path, name, with_filter, waiter, ppo)
    env = {
        **os.environ,
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "OMP_NUM_THREADS": "1",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "rlvr_lightning.cli", "fit", "--config", str(cfg)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / f"{name}.stderr", "w"),
    )
    return process, marker


def kill_when_waiting(process: subprocess.Popen, marker: Path, tmp_path: Path, name: str) -> None:
    deadline = time.monotonic() + 300
    while not marker.exists():
        if process.poll() is not None:
            raise AssertionError(
                f"the run exited ({process.returncode}) before step {K}:\n"
                + (tmp_path / f"{name}.stderr").read_text()[-3000:]
            )
        assert time.monotonic() < deadline, "the run did not reach the kill point"
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)  # kill -9
    assert process.wait(timeout=60) == -signal.SIGKILL


@pytest.mark.parametrize(
    ("with_filter", "ppo"), [(False, False), (True, False), (False, True)], ids=["plain", "difficulty_filter", "ppo"]
)
def test_sigkill_then_resume_is_bitwise_identical(tmp_path, monkeypatch, with_filter, ppo):
    monkeypatch.chdir(tmp_path)
    process, marker = start_killed_run(tmp_path, "killed", with_filter, ppo)  # runs while the reference trains here

    full = main(["fit", "--config", str(config(tmp_path, "full", with_filter, ppo=ppo))])
    assert full.trainer.fit_loop.epoch_loop._batches_that_stepped == STEPS_PER_EPOCH * EPOCHS
    expected = parameters(full.model)

    kill_when_waiting(process, marker, tmp_path, "killed")
    last = tmp_path / "ckpt_killed" / "last.ckpt"
    assert (
        torch.load(last, weights_only=False)["loops"]["fit_loop"]["epoch_loop.state_dict"]["_batches_that_stepped"]
        == K - 1
    )

    # resume through the CLI's `--ckpt_path last` (same config as the killed run, minus the kill point)
    resumed_cfg = config(tmp_path, "resumed", with_filter, ppo=ppo)
    resumed_cfg.write_text(resumed_cfg.read_text().replace("ckpt_resumed", "ckpt_killed"))
    resumed = main(["fit", "--config", str(resumed_cfg), "--ckpt_path", "last"])
    assert resumed.trainer.fit_loop.epoch_loop._batches_that_stepped == STEPS_PER_EPOCH * EPOCHS

    assert full.datamodule.topup_batches > 0 or with_filter  # dynamic sampling drew top-ups (reset at refreshes)
    assert resumed.datamodule.topup_batches == full.datamodule.topup_batches
    actual = parameters(resumed.model)
    assert expected.keys() == actual.keys() and any(k.startswith("reference.") for k in expected)
    assert not ppo or any("value" in k for k in expected)  # PPO: the critic's value head too
    for key in expected:
        assert torch.equal(expected[key], actual[key]), key  # bitwise, policy and reference

    full_log, killed_log, resumed_log = (logged(tmp_path, n) for n in ("full", "killed", "resumed"))
    assert sorted(full_log) == list(range(STEPS_PER_EPOCH * EPOCHS))
    assert sorted(resumed_log) == list(range(K, STEPS_PER_EPOCH * EPOCHS))
    assert resumed_log == {step: full_log[step] for step in resumed_log}
    assert killed_log == {step: full_log[step] for step in range(K)}
    if with_filter:
        kept = logged(tmp_path, "full", "curriculum/kept")
        assert sorted(kept) == [0, STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH]  # before training, then every epoch
        assert logged(tmp_path, "resumed", "curriculum/kept") == {8: kept[8]}  # the refresh after the resume point
        curriculum = [run.datamodule.difficulty_filter.state_dict() for run in (full, resumed)]
        for state in curriculum:
            assert state.pop("last_stats")["curriculum/estimation_s"] > 0  # wall time: the one thing that differs
        assert curriculum[0] == curriculum[1] and curriculum[0]["kept"]


def test_resume_from_an_epoch_end_checkpoint_with_the_filter(tmp_path, monkeypatch):
    """The checkpoint of step 4 closes epoch 0: the resumed run must refresh the curriculum exactly as the full
    run did."""
    monkeypatch.chdir(tmp_path)
    full = main(["fit", "--config", str(config(tmp_path, "full", True))])
    (tmp_path / "ckpt_resumed").mkdir()
    # as last.ckpt: LightningCLI parses a checkpoint named by path for model hyper-parameters, which cannot
    # rebuild the policy
    shutil.copy(tmp_path / "ckpt_full" / "epoch=0-rollout_step=4.ckpt", tmp_path / "ckpt_resumed" / "last.ckpt")
    resumed = main(["fit", "--config", str(config(tmp_path, "resumed", True)), "--ckpt_path", "last"])
    for key, value in parameters(full.model).items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key
    full_log, resumed_log = logged(tmp_path, "full"), logged(tmp_path, "resumed")
    assert sorted(resumed_log) == list(range(4, STEPS_PER_EPOCH * EPOCHS))
    assert resumed_log == {step: full_log[step] for step in resumed_log}

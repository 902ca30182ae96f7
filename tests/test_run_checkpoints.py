"""Resume always resumes: a run's checkpoints live in a directory its command names (never a logger's id),
`--ckpt_path last` of the same command continues it, `last.ckpt` is always the newest state, and the
checkpoint and interrupt callbacks survive any stack of `--config` files.

The interrupted runs are in this process: a callback sends SIGINT to the process at the start of a step,
`SaveOnInterrupt` saves `last.ckpt` at its end and `entry_point` returns 130.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import re
import signal
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint

from rlvr_lightning.callbacks import RolloutCheckpoint
from rlvr_lightning.callbacks.interrupt import SaveOnInterrupt
from rlvr_lightning.cli.app import entry_point, main
from rlvr_lightning.modules.distillation import DistillationConfig

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
INTERRUPTED = 128 + signal.SIGINT


class SendSigint(Callback):
    """Ctrl-C at the start of rollout step `step` (0-based), as a user would press it in the middle of a step."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.fit_loop.epoch_loop._batches_that_stepped == self.step:
            os.kill(os.getpid(), signal.SIGINT)


def steps_in(checkpoint: Path) -> int:
    """Rollout steps completed when the checkpoint was written."""
    state = torch.load(checkpoint, weights_only=False)
    return state["loops"]["fit_loop"]["epoch_loop.state_dict"]["_batches_that_stepped"] + 1


def logged_steps(log_dir: Path) -> list[int]:
    with open(log_dir / "metrics.csv") as f:
        return sorted({int(row["step"]) for row in csv.DictReader(f) if row.get("train/reward_mean")})


def csv_logger(tmp_path: Path) -> str:
    return "--trainer.logger=" + json.dumps(
        {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(tmp_path / "logs")}}
    )


def quick(tmp_path: Path, steps: int) -> list[str]:
    return [
        f"--trainer.limit_train_batches={steps}",
        "--trainer.limit_val_batches=0",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={tmp_path / 'runs'}",
        csv_logger(tmp_path),
    ]


def test_the_same_command_with_ckpt_path_last_resumes_a_recipe_after_ctrl_c(in_tmp_dir, caplog):
    """configs/recipes/grpo.yaml has no checkpoint callback; Ctrl-C in step 1 saves the state of 2 steps in the
    run's directory (runs/<config names>/checkpoints), and the same command with --ckpt_path last trains steps
    2 and 3 only."""
    overlay = in_tmp_dir / "interrupt.yaml"  # appends to the recipe's callbacks (`callbacks+`)
    overlay.write_text(
        f"trainer:\n  callbacks+:\n    - class_path: {__name__}.SendSigint\n      init_args: {{step: 1}}\n"
    )
    command = ["fit", "--config", str(CONFIGS / "recipes" / "grpo.yaml"), "--config", str(overlay)]
    command += quick(in_tmp_dir, steps=4)

    assert entry_point(command) == INTERRUPTED
    directory = in_tmp_dir / "runs" / "grpo+interrupt" / "checkpoints"
    last = directory / "last.ckpt"
    assert steps_in(last) == 2
    assert f"saved {last} after rollout step 2" in caplog.text

    assert entry_point([*command, "--ckpt_path", "last"]) == 0
    assert logged_steps(in_tmp_dir / "logs" / "lightning_logs" / "version_0") == [0, 1]
    assert logged_steps(in_tmp_dir / "logs" / "lightning_logs" / "version_1") == [2, 3]  # resumed, not restarted
    assert sorted(p.name for p in directory.iterdir()) == ["last.ckpt"]
    assert torch.load(last, weights_only=False)["loops"]["fit_loop"]["epoch_loop.state_dict"] == {
        "_batches_that_stepped": 4  # saved at the epoch end, when the count includes the last step
    }


TINY = """
seed_everything: 0
trainer:
  max_epochs: 1
  limit_train_batches: 4
  limit_val_batches: 0
  enable_progress_bar: false
  enable_model_summary: false
  logger: false
  callbacks:
    - class_path: rlvr_lightning.rewards.SortInclusionOrderingReward
    - class_path: rlvr_lightning.callbacks.RolloutCheckpoint
      init_args: {checkpoint}
model:
  class_path: rlvr_lightning.modules.RLVRModule
  init_args:
    policy:
      class_path: rlvr_lightning.policies.ToySortPolicy
      init_args: {{vocab_size: 5, prompt_length: 3, embedding_dim: 8}}
    group_size: 4
data:
  class_path: rlvr_lightning.data.RLVRDataModule
  init_args:
    batch_size: 8
    task: {{class_path: rlvr_lightning.data.SortTask, init_args: {{vocab_size: 5, length: 3, num_val: 0}}}}
"""


def test_last_ckpt_is_the_newest_state_after_an_interrupt_and_a_resume(in_tmp_dir):
    """Ctrl-C in the first step, before any periodic save; the resumed run's saves land in last.ckpt itself (not
    in last-v1.ckpt beside the interrupt's, which `rlvr validate --ckpt_path .../last.ckpt` would then read)."""
    directory = in_tmp_dir / "ckpt"
    config = in_tmp_dir / "run.yaml"
    config.write_text(TINY.format(checkpoint=f"{{dirpath: {directory}, every_n_rollout_steps: 2, save_last: true}}"))
    overlay = in_tmp_dir / "interrupt.yaml"
    overlay.write_text(
        f"trainer:\n  callbacks+:\n    - class_path: {__name__}.SendSigint\n      init_args: {{step: 0}}\n"
    )

    assert entry_point(["fit", "--config", str(config), "--config", str(overlay)]) == INTERRUPTED
    assert steps_in(directory / "last.ckpt") == 1
    assert entry_point(["fit", "--config", str(config), "--ckpt_path", "last"]) == 0
    assert sorted(p.name for p in directory.glob("last*")) == ["last.ckpt"]
    assert steps_in(directory / "last.ckpt") == 4


def test_keep_last_keeps_the_newest_periodic_checkpoints(in_tmp_dir):
    directory = in_tmp_dir / "ckpt"
    config = in_tmp_dir / "run.yaml"
    checkpoint = f"{{dirpath: {directory}, every_n_rollout_steps: 1, keep_last: 2, save_last: true}}"
    config.write_text(TINY.format(checkpoint=checkpoint))
    main(["fit", "--config", str(config)])
    assert sorted(p.name for p in directory.iterdir()) == [
        "epoch=0-rollout_step=3.ckpt",
        "epoch=0-rollout_step=4.ckpt",
        "last.ckpt",
    ]
    # resumed from step 3's file: the run knows what it kept and prunes it on
    kept = sorted(p.name for p in directory.iterdir())
    main(["fit", "--config", str(config), "--ckpt_path", str(directory / "epoch=0-rollout_step=3.ckpt")])
    assert sorted(p.name for p in directory.iterdir()) == kept
    with pytest.raises(ValueError, match="keep_last must be >= 1"):
        RolloutCheckpoint(keep_last=0)
    with pytest.raises(ValueError, match="without monitor='val/accuracy'"):
        RolloutCheckpoint(keep_last=2, monitor="val/accuracy")


def test_checkpoint_and_interrupt_callbacks_survive_a_config_that_replaces_the_callbacks(in_tmp_dir, caplog):
    """A second --config that replaces `trainer.callbacks` drops sort_grpo's RolloutCheckpoint: rlvr adds one in
    the run's directory, and SaveOnInterrupt, whatever the list. A run started without --ckpt_path where an
    earlier one left last.ckpt says so, and overwrites it."""
    earlier = in_tmp_dir / "runs" / "sort_grpo+my_rewards" / "checkpoints" / "last.ckpt"
    earlier.parent.mkdir(parents=True)
    earlier.write_text("an earlier run's")
    overlay = in_tmp_dir / "my_rewards.yaml"
    overlay.write_text(
        "trainer:\n  callbacks:\n    - class_path: rlvr_lightning.rewards.SortInclusionOrderingReward\n"
        "    - class_path: rlvr_lightning.advantages.GroupNormalizedAdvantage\n"
    )
    cli = main(["fit", "--config", str(CONFIGS / "sort_grpo.yaml"), "--config", str(overlay), *quick(in_tmp_dir, 1)])
    checkpoints = cli.trainer.checkpoint_callbacks
    assert len(checkpoints) == 1 and checkpoints[0].save_last
    assert checkpoints[0].dirpath == str(in_tmp_dir / "runs" / "sort_grpo+my_rewards" / "checkpoints")
    assert sum(isinstance(cb, SaveOnInterrupt) for cb in cli.trainer.callbacks) == 1
    assert f"rlvr: {earlier} is the checkpoint of an earlier run; this run starts over and overwrites it" in caplog.text
    assert steps_in(earlier) == 1 + 1  # this run's, saved at its epoch end


TOY_MODEL = {
    "class_path": "rlvr_lightning.modules.RLVRModule",
    "init_args": {
        "policy": {
            "class_path": "rlvr_lightning.policies.ToySortPolicy",
            "init_args": {"vocab_size": 5, "prompt_length": 3, "embedding_dim": 8},
        },
        # a distillation config's teacher scores the real task's tokens: the toy policy runs without one
        "teacher": None,
        "distillation": dataclasses.asdict(DistillationConfig()),
    },
}
TOY_DATA = {
    "class_path": "rlvr_lightning.data.RLVRDataModule",
    "init_args": {"task": {"class_path": "rlvr_lightning.data.SortTask", "init_args": {"vocab_size": 5, "length": 3}}},
}
SHIPPED = [
    [path]
    for folder in ("", "recipes", "length_bias")
    for path in sorted((CONFIGS / folder).glob("*.yaml"))
    if path.name != "sft.yaml"  # an SFT module: its data module is replaced below by an RL one
] + [[CONFIGS / "gsm8k_qwen2.5_math_1.5b.yaml", overlay] for overlay in sorted((CONFIGS / "gpu").glob("*.yaml"))]


@pytest.mark.parametrize("configs", SHIPPED, ids=["+".join(p.stem for p in c) for c in SHIPPED])
def test_every_shipped_config_checkpoints_where_the_same_command_finds_it(configs, in_tmp_dir):
    """With the default loggers (W&B with a random run id, CSV with a version counter), every checkpoint directory
    is known before any logger starts: the config's `dirpath` or the run's, <default_root_dir>/<config
    names>/checkpoints. (The model and data are swapped for toy ones and the trainer kept on one CPU process: the
    checkpoint callbacks are the config's.)"""
    command = [arg for path in configs for arg in ("--config", str(path))]
    command += ["--model", json.dumps(TOY_MODEL), "--data", json.dumps(TOY_DATA)]
    command += ["--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.strategy=auto"]
    command += ["--trainer.precision=32-true"]
    try:
        trainer = main(command, run=False).trainer
    except ValueError as error:
        if "not in the local cache" in str(error):  # a reward that loads a model (the judge)
            pytest.skip("a reward of this config loads a model that is not in the local cache")
        raise
    if "enable_checkpointing: false" in configs[0].read_text():  # the 4-step demo
        assert trainer.checkpoint_callbacks == []
        return
    assert trainer.checkpoint_callbacks and all(isinstance(cb, ModelCheckpoint) for cb in trainer.checkpoint_callbacks)
    directories = {str(callback.dirpath) for callback in trainer.checkpoint_callbacks}
    explicit = re.findall(r"dirpath: ([^,}\s]+)", "".join(path.read_text() for path in configs))
    expected = {os.path.realpath(path) for path in explicit}
    if len(explicit) < len(trainer.checkpoint_callbacks):
        expected.add(str(in_tmp_dir / "runs" / "+".join(p.stem for p in configs) / "checkpoints"))
    assert directories == expected


def test_run_name_names_the_directory(in_tmp_dir):
    trainer = main(["--config", str(CONFIGS / "recipes" / "grpo.yaml"), "--run_name", "mine"], run=False).trainer
    assert [cb.dirpath for cb in trainer.checkpoint_callbacks] == [str(in_tmp_dir / "runs" / "mine" / "checkpoints")]

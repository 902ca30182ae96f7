"""Checkpoint files survive SIGKILL at any instant; unreadable ones fail with the file and the reason."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from rlvr_lightning.callbacks import AtomicCheckpointIO, CheckpointReadError, ResumeState
from rlvr_lightning.callbacks.checkpointing import remove_partial_checkpoints
from rlvr_lightning.cli.app import main

PAYLOAD = 1_000_000  # floats: 4 MB, so a write takes long enough to be killed in the middle of


def checkpoint(version: int, payload: torch.Tensor) -> dict:
    payload[0] = version
    return {"version": version, "payload": payload, "tail": version}


def check(path: Path) -> int:
    """Loads `path` as the trainer would and checks it is whole; returns its version."""
    loaded = AtomicCheckpointIO().load_checkpoint(path)
    assert loaded["payload"].numel() == PAYLOAD and int(loaded["payload"][0]) == loaded["version"] == loaded["tail"]
    return loaded["version"]


class Stall:
    """A file wrapper that stalls half-way through the checkpoint's bytes (to be killed there)."""

    def __init__(self, f, signal_fd: int) -> None:
        self.f, self.signal_fd, self.written = f, signal_fd, 0

    def write(self, data) -> int:
        self.written += len(data)
        result = self.f.write(data)
        if self.written > 2 * PAYLOAD and self.signal_fd >= 0:  # half of the 4 MB written
            self.f.flush()
            os.write(self.signal_fd, b"x")
            self.signal_fd = -1
            time.sleep(600)
        return result

    def __getattr__(self, name):
        return getattr(self.f, name)


def _writer(directory: str, atomic: bool, stall_fd: int, started_fd: int) -> None:
    """Child process: write last.ckpt over and over (version 1, 2, ...)."""
    torch.set_num_threads(1)
    io = AtomicCheckpointIO()
    payload = torch.zeros(PAYLOAD)
    path = os.path.join(directory, "last.ckpt")
    io.save_checkpoint(checkpoint(1, payload), path)
    os.write(started_fd, b"x")
    if stall_fd >= 0:  # stall in the next write, through the real code path
        real_save = torch.save
        torch.save = lambda obj, f, **kw: real_save(obj, Stall(f, stall_fd), **kw)
    version = 2
    while True:
        if atomic:
            io.save_checkpoint(checkpoint(version, payload), path)
        else:  # what a plain torch.save to the target does
            with open(path, "wb") as f:
                torch.save(checkpoint(version, payload), f)
        version += 1


def start_writer(tmp_path: Path, atomic: bool, stall: bool):
    context = multiprocessing.get_context("fork")
    started_r, started_w = os.pipe()
    stall_r, stall_w = os.pipe()
    process = context.Process(
        target=_writer, args=(str(tmp_path), atomic, stall_w if stall else -1, started_w), daemon=True
    )
    process.start()
    assert os.read(started_r, 1) == b"x"  # version 1 is on disk
    return process, stall_r


def kill(process) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.join(timeout=30)
    assert process.exitcode == -signal.SIGKILL


@pytest.mark.parametrize("atomic", [True, False], ids=["atomic", "plain_torch_save"])
def test_kill_in_the_middle_of_a_write(tmp_path, atomic):
    """Killed with half of version 2 written: the atomic writer leaves version 1; a plain torch.save leaves garbage."""
    process, stall_r = start_writer(tmp_path, atomic, stall=True)
    assert os.read(stall_r, 1) == b"x"  # half-way through version 2
    kill(process)
    if atomic:
        assert check(tmp_path / "last.ckpt") == 1
        assert len(list(tmp_path.glob(".last.ckpt.*.partial"))) == 1  # the interrupted write
        assert remove_partial_checkpoints(tmp_path) and not list(tmp_path.glob(".*"))
    else:
        with pytest.raises(CheckpointReadError, match=r"cannot read checkpoint .*last\.ckpt"):
            check(tmp_path / "last.ckpt")


def test_kill_at_random_instants_never_leaves_an_unreadable_last_ckpt(tmp_path):
    rng = random.Random(0)
    kills, mid_write, versions = 40, 0, []
    for attempt in range(kills):
        directory = tmp_path / str(attempt)
        directory.mkdir()
        process, _ = start_writer(directory, atomic=True, stall=False)
        time.sleep(rng.uniform(0, 0.15))
        kill(process)
        mid_write += bool(list(directory.glob(".*.partial")))
        versions.append(check(directory / "last.ckpt"))
    print(
        f"{kills} kills, {mid_write} in the middle of a write, versions {min(versions)}..{max(versions)}; all readable"
    )
    assert mid_write >= kills // 4  # the instants did hit writes in progress


def test_save_failure_keeps_the_previous_file_and_cleans_up(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = tmp_path / "sub" / "last.ckpt"
    io.save_checkpoint({"version": 1}, path)

    def failing_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="No space left"):
        io.save_checkpoint({"version": 2}, path)
    monkeypatch.undo()
    assert io.load_checkpoint(path) == {"version": 1}
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # like a file opened normally


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"", "the file is empty"),
        (b"not a checkpoint at all", "not a torch.save zip archive"),
        (None, "truncated or corrupt"),
    ],
    ids=["empty", "garbage", "truncated"],
)
def test_unreadable_checkpoint_names_the_file_and_the_reason(tmp_path, content, reason):
    path = tmp_path / "last.ckpt"
    if content is None:
        torch.save({"state_dict": {"w": torch.zeros(1000)}}, path)
        path.write_bytes(path.read_bytes()[:-300])
    else:
        path.write_bytes(content)
    with pytest.raises(CheckpointReadError, match=rf"cannot read checkpoint {path}.*({reason})"):
        AtomicCheckpointIO().load_checkpoint(path)
    with pytest.raises(FileNotFoundError, match="missing.ckpt"):
        AtomicCheckpointIO().load_checkpoint(tmp_path / "missing.ckpt")


def test_the_trainer_uses_it_and_reports_unreadable_checkpoints(tmp_path):
    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def trainer():
        return pl.Trainer(
            max_steps=2,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[ResumeState(), pl.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True)],
        )

    data = torch.utils.data.DataLoader(torch.randn(4, 2), batch_size=2)
    fitted = trainer()
    fitted.fit(Tiny(), data)
    assert isinstance(fitted.strategy.checkpoint_io, AtomicCheckpointIO)
    last = tmp_path / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    with pytest.raises(CheckpointReadError, match=rf"cannot read checkpoint {last}, \d+ bytes, truncated or corrupt"):
        trainer().fit(Tiny(), data, ckpt_path="last")


def test_rlvr_gives_every_run_one_resume_state():
    """`rlvr` adds the callback (the data module does not), once, before any stage runs."""
    config = Path(__file__).resolve().parents[1] / "configs" / "sort_lecture.yaml"
    cli = main(["--config", str(config), "--trainer.logger=false", "--trainer.enable_checkpointing=false"], run=False)
    assert sum(isinstance(cb, ResumeState) for cb in cli.trainer.callbacks) == 1


REAL_RUN = """
seed_everything: 0
trainer:
  max_epochs: 1
  limit_train_batches: 100000
  limit_val_batches: 0
  enable_progress_bar: false
  enable_model_summary: false
  logger: false
  callbacks:
    - class_path: rlvr_lightning.rewards.SortInclusionOrderingReward
    - class_path: rlvr_lightning.callbacks.RolloutCheckpoint
      init_args: {{dirpath: {dirpath}, every_n_rollout_steps: 1, save_last: true}}
model:
  class_path: rlvr_lightning.modules.RLVRModule
  init_args:
    policy:
      class_path: rlvr_lightning.policies.ToySortPolicy
      init_args: {{vocab_size: 5, prompt_length: 3, embedding_dim: 512}}
    group_size: 4
data:
  class_path: rlvr_lightning.data.RLVRDataModule
  init_args:
    batch_size: 8
    task: {{class_path: rlvr_lightning.data.SortTask, init_args: {{vocab_size: 5, length: 3, num_val: 0}}}}
"""


def test_rlvr_fit_killed_while_checkpointing_every_step_resumes(tmp_path, monkeypatch):
    """A real `rlvr fit` saving a ~19 MB checkpoint (policy, Adam moments) after every step, killed at a random
    instant after its first checkpoint; the run resumes from what the kill left."""
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "run.yaml"
    config.write_text(REAL_RUN.format(dirpath=tmp_path / "ckpt"))
    last = tmp_path / "ckpt" / "last.ckpt"
    process = subprocess.Popen(
        [sys.executable, "-m", "rlvr_lightning.cli", "fit", "--config", str(config)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while not last.exists():
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(random.Random(1).uniform(0.2, 1.0))
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=60) == -signal.SIGKILL
    step = AtomicCheckpointIO().load_checkpoint(last)["loops"]["fit_loop"]["epoch_loop.state_dict"][
        "_batches_that_stepped"
    ]
    resumed = main(["fit", "--config", str(config), "--ckpt_path", "last", f"--trainer.limit_train_batches={step + 3}"])
    assert resumed.trainer.fit_loop.epoch_loop._batches_that_stepped == step + 3
    assert not list(last.parent.glob(".*.partial"))  # the killed write's leftovers were removed

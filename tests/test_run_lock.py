"""One run at a time per checkpoint directory: a second `rlvr fit` of the same name stops before anything is
built, naming the directory and the other run's process; `--ckpt_path last` never resumes a run that is still
going; the lock is released however a run ends, and a dead process's lock is taken over with a message.
Under DDP the run holds one lock, taken by global rank 0."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest

from rlvr_lightning.callbacks import run_lock
from rlvr_lightning.callbacks.run_checkpoints import configured_directories
from rlvr_lightning.callbacks.run_lock import RunDirectoryLocked, RunLock, is_global_rank_zero, lock_path
from rlvr_lightning.cli import RLVRCLI, entry_point

from .cli_runs import run

ROOT = Path(__file__).resolve().parents[1]
RUN = """
seed_everything: {seed}
trainer:
  max_epochs: 1
  limit_train_batches: 2
  limit_val_batches: 0
  enable_progress_bar: false
  enable_model_summary: false
  logger: false
  callbacks:
    - class_path: rlvr_lightning.rewards.SortInclusionOrderingReward
{extra}model:
  class_path: rlvr_lightning.modules.RLVRModule
  init_args:
    policy:
      class_path: rlvr_lightning.policies.toy_sort.ToySortPolicy
      init_args: {{vocab_size: 5, prompt_length: 3, embedding_dim: 8}}
    group_size: 4
data:
  class_path: rlvr_lightning.data.RLVRDataModule
  init_args:
    batch_size: 4
    task: {{class_path: rlvr_lightning.data.SortTask, init_args: {{vocab_size: 5, length: 3, num_val: 0}}}}
"""
HOLD = "import sys, time; from rlvr_lightning.callbacks.run_lock import RunLock; RunLock(sys.argv[1]).acquire(); "
HOLD += "print('locked', flush=True); time.sleep(600)"


def hold_lock(directory: Path) -> subprocess.Popen:
    """Another process that holds the lock of `directory` until it is killed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(directory)], stdout=subprocess.PIPE, text=True, env=env)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def build(*args, **kwargs):
    raise AssertionError("the configured classes were built before the lock was checked")


@pytest.fixture
def no_model_building(monkeypatch):
    monkeypatch.setattr(RLVRCLI, "instantiate_classes", build)


def test_a_second_run_of_the_same_name_stops_at_once_naming_the_directory_and_the_other_run(in_tmp_dir, capsys, caplog):
    Path("run.yaml").write_text(RUN.format(seed=1, extra=""))
    directory = in_tmp_dir / "runs" / "run" / "checkpoints"
    holder = hold_lock(directory)
    try:
        for extra in ([], ["--ckpt_path", "last"]):  # resuming does not take over a run that is still going
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(RLVRCLI, "instantiate_classes", build)
                code, lines = run(capsys, "fit", "--config", "run.yaml", *extra)
            assert code == 2
            assert lines[0].startswith(
                f"error: {directory} is in use by another run: process {holder.pid} on {socket.gethostname()}, started "
            )
            assert lines[1] == (
                "  choose another name for this run with --run_name NAME, or resume that run with --ckpt_path last "
                "once it has ended"
            )
            assert len(lines) == 3
        assert entry_point(["fit", "--config", "run.yaml", "--run_name", "other"]) == 0
        assert (in_tmp_dir / "runs" / "other" / "checkpoints" / "last.ckpt").is_file()
        assert not lock_path(in_tmp_dir / "runs" / "other" / "checkpoints").exists()  # released at the end
    finally:
        holder.kill()
        holder.wait()
    # killed (SIGKILL): its lock file is left, its lock is not; the next run takes it over and says so
    assert json.loads(lock_path(directory).read_text())["pid"] == holder.pid
    assert entry_point(["fit", "--config", "run.yaml"]) == 0
    assert f"rlvr: {directory} was locked by process {holder.pid} on {socket.gethostname()}" in caplog.text
    assert "which is no longer running: this run takes it over" in caplog.text
    assert (directory / "last.ckpt").is_file() and not lock_path(directory).exists()


def test_a_checkpoint_callback_with_its_own_dirpath_locks_that_directory(in_tmp_dir, capsys, no_model_building):
    directory = in_tmp_dir / "mine"
    checkpoint = "    - class_path: rlvr_lightning.callbacks.RolloutCheckpoint\n"
    checkpoint += f"      init_args: {{dirpath: {directory}}}\n"
    Path("run.yaml").write_text(RUN.format(seed=0, extra=checkpoint))
    lock = RunLock(directory)  # this process, another open file: flock tells them apart
    lock.acquire()
    try:
        code, lines = run(capsys, "fit", "--config", "run.yaml", "--run_name", "another_name")
    finally:
        lock.release()
    assert code == 2
    assert lines[0].startswith(f"error: {directory} is in use by another run: process {os.getpid()}")
    assert lines[1].startswith("  give this run's checkpoint callback another dirpath, or resume that run")
    assert not (in_tmp_dir / "runs" / "another_name" / "checkpoints.lock").exists()  # that one is not written


class FailsInStep(pl.Callback):
    def on_train_batch_start(self, *args) -> None:
        raise RuntimeError("a bug in a callback")


def test_the_lock_is_released_when_a_run_fails(in_tmp_dir):
    failing = f"    - class_path: {__name__}.FailsInStep\n"
    Path("run.yaml").write_text(RUN.format(seed=0, extra=failing))
    with pytest.raises(RuntimeError, match="a bug in a callback"):
        entry_point(["fit", "--config", "run.yaml"])
    directory = in_tmp_dir / "runs" / "run" / "checkpoints"
    assert not lock_path(directory).exists()
    lock = RunLock(directory)
    assert lock.acquire() is None  # free, and no dead holder to take over from
    lock.release()


def test_validate_and_predict_take_no_lock(in_tmp_dir, capsys):
    Path("run.yaml").write_text(RUN.format(seed=0, extra=""))
    lock = RunLock(in_tmp_dir / "runs" / "run" / "checkpoints")
    lock.acquire()
    try:
        assert entry_point(["predict", "--config", "run.yaml", "--trainer.limit_predict_batches=1"]) == 0
    finally:
        lock.release()


def test_without_flock_the_lock_files_process_is_checked(tmp_path, monkeypatch):
    def no_flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    directory = tmp_path / "checkpoints"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        live = {"pid": sleeper.pid, "host": socket.gethostname(), "started": "2025-01-01 00:00:00"}
        lock_path(directory).write_text(json.dumps(live))
        with pytest.raises(RunDirectoryLocked, match=f"in use by another run: process {sleeper.pid} on "):
            RunLock(directory).acquire()
    finally:
        sleeper.kill()
        sleeper.wait()
    assert RunLock(directory).acquire() == live  # its process is gone: taken over
    elsewhere = {"pid": 1, "host": "another-node"}
    lock_path(directory).write_text(json.dumps(elsewhere))
    with pytest.raises(RunDirectoryLocked, match=f"if no run is going on there, delete {lock_path(directory)}"):
        RunLock(directory).acquire()


def test_global_rank_zero_is_read_from_the_launchers_variables(monkeypatch):
    for name in run_lock.RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert is_global_rank_zero()
    for name, value, expected in [
        ("LOCAL_RANK", "1", False),  # a process Lightning's launcher started for another device
        ("NODE_RANK", "1", False),  # the first process of a second node
        ("RANK", "3", False),  # torchrun
        ("SLURM_PROCID", "0", True),
        ("RANK", "0", True),
    ]:
        monkeypatch.setenv(name, value)
        assert is_global_rank_zero() is expected, (name, value)
        monkeypatch.delenv(name)


RECORDER = """
import json, os
import lightning.pytorch as pl

class LockRecorder(pl.Callback):
    def __init__(self, out: str, lock: str):
        self.out, self.lock = out, lock
    def on_train_start(self, trainer, pl_module):
        trainer.strategy.barrier()
        holder = json.load(open(self.lock)) if os.path.exists(self.lock) else None
        json.dump({"pid": os.getpid(), "holder": holder}, open(f"{self.out}/rank{trainer.global_rank}.json", "w"))
"""


def test_under_ddp_global_rank_zero_holds_the_one_lock(tmp_path):
    (tmp_path / "lock_recorder.py").write_text(RECORDER)
    directory = tmp_path / "runs" / "ddp" / "checkpoints"
    recorder = (
        "    - class_path: lock_recorder.LockRecorder\n"
        f"      init_args: {{out: {tmp_path}, lock: {lock_path(directory)}}}\n"
    )
    config = tmp_path / "ddp.yaml"
    config.write_text(RUN.format(seed=0, extra=recorder).replace("  max_epochs: 1\n", DDP))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "rlvr_lightning.cli", "fit", "--config", str(config)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0]["pid"] != ranks[1]["pid"]
    assert ranks[0]["holder"]["pid"] == ranks[1]["holder"]["pid"] == ranks[0]["pid"]
    assert (directory / "last.ckpt").is_file() and not lock_path(directory).exists()


DDP = "  strategy: ddp\n  accelerator: cpu\n  devices: 2\n  max_epochs: 1\n"


def test_the_directories_a_config_locks():
    run_directory = "/runs/run/checkpoints"

    def checkpoint(**init_args) -> dict:
        return {"class_path": "rlvr_lightning.callbacks.RolloutCheckpoint", "init_args": init_args}

    reward = {"class_path": "rlvr_lightning.rewards.SortInclusionOrderingReward"}
    assert configured_directories([reward], run_directory) == {run_directory: True}  # rlvr adds the checkpoint
    assert configured_directories([reward, checkpoint()], run_directory) == {run_directory: True}
    assert configured_directories([checkpoint(dirpath="/mine")], run_directory) == {"/mine": False}
    assert configured_directories([checkpoint(dirpath="s3://bucket/run")], run_directory) == {}  # remote: no lock
    assert configured_directories([reward], run_directory, enabled=False) == {}

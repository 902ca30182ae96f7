"""A checkpoint that cannot be written (disk full, a directory that cannot be written) or that does not exist:
a short error naming the directory and the space, the previous checkpoint intact, no temporary file left.

The disk fills in the middle of `torch.save`: a file wrapper passes the first bytes on to the real file, then
raises ENOSPC as a full file system does. (Tests run as root, which no file mode stops: the unwritable
directory is a path under a regular file.)
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback

from rlvr_lightning.cli.app import entry_point
from rlvr_lightning.runtime.checkpoint_files import (
    AtomicCheckpointIO,
    CheckpointWriteError,
    check_writable_directory,
    remove_partial_checkpoints,
)
from tests.test_run_checkpoints import TINY, steps_in

PAYLOAD = 1_000_000  # floats: a 4 MB checkpoint


class DiskFull:
    """A file that takes `room` bytes, then fails every write with ENOSPC."""

    def __init__(self, f, room: int) -> None:
        self.f, self.room = f, room

    def write(self, data) -> int:
        if len(data) > self.room:
            self.f.write(bytes(data[: self.room]))
            self.room = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)


def fill_the_disk(monkeypatch, after_saves: int = 0, room: int = 100_000) -> None:
    """The disk fills during the torch.save after the first `after_saves` ones."""
    real_save, saves = torch.save, [0]

    def save(obj, f, **kwargs):
        saves[0] += 1
        return real_save(obj, f if saves[0] <= after_saves else DiskFull(f, room), **kwargs)

    monkeypatch.setattr(torch, "save", save)


def test_a_full_disk_keeps_the_previous_checkpoint_and_names_directory_and_space(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = tmp_path / "ckpt" / "last.ckpt"
    io.save_checkpoint({"version": 1, "payload": torch.zeros(PAYLOAD)}, path)
    fill_the_disk(monkeypatch)
    with pytest.raises(CheckpointWriteError) as raised:
        io.save_checkpoint({"version": 2, "payload": torch.ones(PAYLOAD)}, path)
    monkeypatch.undo()
    message = str(raised.value)
    assert message.startswith(f"cannot write checkpoint {path}: No space left on device\nin {path.parent}: ")
    assert "the checkpoint needs about 4.0 MB" in message
    assert message.endswith(" free; the previous checkpoint is intact")
    assert io.load_checkpoint(path)["version"] == 1  # intact
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]  # the partial file was removed


def test_a_directory_that_cannot_be_created_is_named_with_the_reason(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(CheckpointWriteError, match=f"cannot write checkpoints to {blocker}/ckpt: {blocker} is a file"):
        AtomicCheckpointIO().save_checkpoint({"version": 1}, blocker / "ckpt" / "last.ckpt")


def test_the_write_check_survives_rank_zero_sweeping_partial_checkpoints_meanwhile(tmp_path, monkeypatch):
    """Ranks check the checkpoint directory at once, while rank 0 removes partial files left by killed writes."""
    real_close = os.close

    def close_then_sweep(fd):
        real_close(fd)
        remove_partial_checkpoints(tmp_path)  # what rank 0 does between another rank's create and unlink

    monkeypatch.setattr(os, "close", close_then_sweep)
    check_writable_directory(tmp_path)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def run_config(tmp_path: Path, dirpath: Path) -> Path:
    config = tmp_path / "run.yaml"
    checkpoint = f"{{dirpath: {dirpath}, every_n_rollout_steps: 1, save_last: true, save_top_k: 0}}"
    config.write_text(TINY.format(checkpoint=checkpoint).replace("embedding_dim: 8", "embedding_dim: 256"))
    return config


def short_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err
    error_lines = lines[next(i for i, line in enumerate(lines) if line.startswith("error: ")) :]
    assert len(error_lines) <= 5, err
    return "\n".join(error_lines)


def test_rlvr_fit_on_a_full_disk_says_so_in_a_few_lines(in_tmp_dir, monkeypatch, capsys):
    """Two checkpoints are written, the disk is full at the third: exit status 1, a few lines naming the directory,
    the space needed and free; last.ckpt is still the second step's, and no temporary file is left."""
    directory = in_tmp_dir / "ckpt"
    fill_the_disk(monkeypatch, after_saves=2)
    assert entry_point(["fit", "--config", str(run_config(in_tmp_dir, directory))]) == 1
    monkeypatch.undo()
    error = short_error(capsys)
    print(error)
    assert error.startswith(f"error: cannot write checkpoint {directory / 'last.ckpt'}: No space left on device\n")
    assert f"in {directory}: the checkpoint needs about " in error and " free" in error
    assert steps_in(directory / "last.ckpt") == 2
    assert [p.name for p in directory.iterdir()] == ["last.ckpt"]


def test_a_full_disk_at_the_first_checkpoint_claims_no_previous_one(in_tmp_dir, monkeypatch, capsys):
    directory = in_tmp_dir / "ckpt"
    fill_the_disk(monkeypatch, after_saves=0)
    assert entry_point(["fit", "--config", str(run_config(in_tmp_dir, directory))]) == 1
    monkeypatch.undo()
    error = short_error(capsys)
    print(error)
    assert error.startswith(f"error: cannot write checkpoint {directory / 'last.ckpt'}: No space left on device\n")
    second = error.splitlines()[1]
    assert second.startswith(f"  in {directory}: the checkpoint needs about ")
    assert second.endswith(" free; there was no earlier checkpoint of that name")
    assert list(directory.iterdir()) == []


class CountSteps(Callback):
    steps = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        CountSteps.steps += 1


def test_rlvr_fit_into_a_directory_that_cannot_be_written_stops_before_the_first_step(in_tmp_dir, capsys):
    blocker = in_tmp_dir / "a_file"
    blocker.write_text("not a directory")
    config = run_config(in_tmp_dir, blocker / "ckpt")
    config.write_text(
        config.read_text().replace("  callbacks:\n", f"  callbacks:\n    - class_path: {__name__}.CountSteps\n")
    )
    CountSteps.steps = 0
    assert entry_point(["fit", "--config", str(config)]) == 1
    error = short_error(capsys)
    print(error)
    assert error.startswith(f"error: cannot write checkpoints to {blocker}/ckpt: {blocker} is a file, not a directory")
    assert CountSteps.steps == 0


@pytest.mark.parametrize("command", ["fit", "validate"])
def test_a_missing_checkpoint_file_is_a_short_error(in_tmp_dir, capsys, command):
    directory = in_tmp_dir / "ckpt"
    config = run_config(in_tmp_dir, directory)
    assert entry_point([command, "--config", str(config), "--ckpt_path", str(directory / "last.ckpt")]) == 2
    error = short_error(capsys)
    print(error)
    assert error.startswith(f"error: checkpoint {directory / 'last.ckpt'} does not exist\n  there is no directory ")
    directory.mkdir()
    (directory / "epoch=0-rollout_step=2.ckpt").touch()
    assert entry_point([command, "--config", str(config), "--ckpt_path", str(directory / "lst.ckpt")]) == 2
    assert f"{directory} holds epoch=0-rollout_step=2.ckpt" in short_error(capsys)


def test_rlvr_export_misuse_is_a_short_error(in_tmp_dir, capsys):
    from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config

    tokenizer = save_tiny_tokenizer(in_tmp_dir / "tokenizer")
    model = {"class_path": "rlvr_lightning.modules.RLVRModule", "init_args": {"policy": {}}}
    model["init_args"]["policy"] = {
        "class_path": "rlvr_lightning.policies.HFPolicy",
        "init_args": {"model": {"config": tiny_llama_config(), "tokenizer": str(tokenizer)}},
    }
    lm = in_tmp_dir / "lm.yaml"
    lm.write_text(json.dumps({"model": model}))
    toy = run_config(in_tmp_dir, in_tmp_dir / "ckpt")
    busy = in_tmp_dir / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    cases = {
        (): "error: the following arguments are required: ckpt_path, output_dir, model",
        ("--config", "nope.yaml", "--ckpt_path", "x.ckpt", "--output_dir", "out"): "nope.yaml",
        (
            "--config",
            str(lm),
            "--ckpt_path",
            "x.ckpt",
            "--output_dir",
            "out",
        ): "error: checkpoint x.ckpt does not exist",
        ("--config", str(lm), "--ckpt_path", "x.ckpt", "--output_dir", str(busy)): f"--output_dir {busy} exists",
        ("--config", str(toy), "--ckpt_path", "x.ckpt", "--output_dir", "out"): "the module's policy is ToySortPolicy",
    }
    for args, expected in cases.items():
        assert entry_point(["export", *args]) == 2, args
        error = short_error(capsys)
        print(error)
        assert expected in error.splitlines()[0], (args, error)
    assert (busy / "keep.txt").read_text() == "mine" and not (in_tmp_dir / "out").exists()

"""Checkpoint files on disk: written so that a crash never loses the last one, read with clear errors.

- `AtomicCheckpointIO`: Lightning `CheckpointIO` plugin. A checkpoint is written to a temporary
  file in the target's directory, flushed and fsynced, renamed over the target (atomic on POSIX)
  and the directory fsynced: a process killed at any instant leaves the previous file intact.
  A checkpoint that cannot be read raises `CheckpointReadError` naming the file and the reason.
  (Lightning's own writer stages the file in the system temp directory, so its final move can be
  a non-atomic copy across file systems, and it never fsyncs.)
- `read_sharded_weights` / `load_checkpoint_weights`: the weights of a `.ckpt` file or of the
  directory of per-rank shards a sharded (FSDP2) run writes, read in one process.
"""

from __future__ import annotations

import os
import uuid
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from torch import nn

PARTIAL_SUFFIX = ".partial"


class CheckpointReadError(RuntimeError):
    """A checkpoint file exists but cannot be loaded."""


def is_local(path) -> bool:
    """Whether `path` names a local file (no URL, or a file:// one)."""
    return "://" not in str(path) or str(path).startswith("file://")


def fsync_directory(directory: str | Path) -> None:
    """Make a rename or a new file in `directory` durable (a no-op where directories cannot be synced)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # some file systems do not allow opening directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class AtomicCheckpointIO(TorchCheckpointIO):
    """`torch.save` to `.<name>.<random>.partial` beside the target, fsync, `os.replace`, fsync the directory."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if not is_local(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint does not take storage_options")
        path = os.path.abspath(str(path).removeprefix("file://"))
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        partial = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}{PARTIAL_SUFFIX}")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, path)
        except BaseException:
            try:
                os.unlink(partial)
            except OSError:
                pass
            raise
        fsync_directory(directory)

    def load_checkpoint(
        self, path, map_location=lambda storage, loc: storage, weights_only: bool | None = None
    ) -> dict[str, Any]:
        if is_local(path):
            local = str(path).removeprefix("file://")
            if not os.path.exists(local):
                raise FileNotFoundError(f"Checkpoint file not found: {path}")
            if os.path.isfile(local) and os.path.getsize(local) == 0:
                raise CheckpointReadError(f"cannot read checkpoint {path}: the file is empty (0 bytes)")
        try:
            checkpoint = super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        except FileNotFoundError:
            raise
        except Exception as error:
            raise CheckpointReadError(
                f"cannot read checkpoint {path}{_diagnose(path)}: {type(error).__name__}: {error}".rstrip()
            ) from error
        if not isinstance(checkpoint, dict):
            raise CheckpointReadError(
                f"cannot read checkpoint {path}: it holds a {type(checkpoint).__name__}, not a dict"
            )
        return checkpoint


def _diagnose(path) -> str:
    """`, <size> bytes[, what is wrong with the file]` for a local checkpoint that failed to load."""
    local = str(path).removeprefix("file://")
    if not is_local(path) or not os.path.isfile(local):
        return ""
    text = f", {os.path.getsize(local)} bytes"
    with open(local, "rb") as f:
        magic = f.read(4)
    if magic == b"PK\x03\x04" and not zipfile.is_zipfile(local):
        text += ", truncated or corrupt (its zip archive has no end record: a write that did not finish?)"
    elif magic != b"PK\x03\x04":
        text += ", not a torch.save zip archive"
    return text


def remove_partial_checkpoints(directory) -> list[Path]:
    """Delete the temporary files that writes killed mid-way left in `directory`; returns them."""
    removed = []
    directory = Path(directory)
    if directory.is_dir():
        for path in directory.glob(f".*{PARTIAL_SUFFIX}"):
            try:
                path.unlink()
                removed.append(path)
            except OSError:
                pass
    return removed


SHARDED_METADATA = "meta.pt"  # what Lightning writes beside the shards of a distributed checkpoint


def read_sharded_weights(path: str | Path, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fill `weights` (state-dict names of the LightningModule -> full tensors of the right shapes) from the
    sharded checkpoint directory `path`, in this one process, whatever the world size that wrote it."""
    path = Path(path)
    if not (path / SHARDED_METADATA).is_file() or not (path / ".metadata").is_file():
        raise ValueError(
            f"{path} is a directory but not a sharded checkpoint (it needs {SHARDED_METADATA} and the "
            ".metadata of torch.distributed.checkpoint)"
        )
    import torch.distributed.checkpoint as dcp

    state = {"state_dict": dict(weights)}  # Lightning saves the module's weights under "state_dict"
    try:
        dcp.load(state, checkpoint_id=str(path), no_dist=True)
    except Exception as error:
        raise RuntimeError(
            f"cannot read the sharded checkpoint {path}: does the config build the model that wrote it? {error}"
        ) from error
    return state["state_dict"]


def load_checkpoint_weights(module: nn.Module, ckpt_path: str | Path) -> str:
    """Load the weights of a Lightning checkpoint (file or sharded directory) into the unsharded `module`,
    strictly. Returns "sharded" or "full"."""
    path = Path(ckpt_path)
    if path.is_dir():
        module.load_state_dict(read_sharded_weights(path, module.state_dict()), strict=True)
        return "sharded"
    if not path.is_file():
        raise FileNotFoundError(f"--ckpt_path {str(ckpt_path)!r} does not exist")
    # a run's own checkpoint: its hyper-parameters hold Python objects (SamplingConfig), so not weights_only
    checkpoint = AtomicCheckpointIO().load_checkpoint(path, map_location="cpu", weights_only=False)
    if "state_dict" not in checkpoint:
        raise ValueError(f"{path} is not a Lightning checkpoint (it has no 'state_dict')")
    try:
        module.load_state_dict(checkpoint["state_dict"], strict=True)
    except RuntimeError as error:
        raise RuntimeError(f"the weights in {path} do not fit the module the config builds: {error}") from error
    return "full"

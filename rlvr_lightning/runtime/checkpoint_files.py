"""Checkpoint files on disk: written so that a crash never loses the last one, read with clear errors.

- `AtomicCheckpointIO`: Lightning `CheckpointIO` plugin. A checkpoint is written to a temporary
  file in the target's directory, flushed and fsynced, renamed over the target (atomic on POSIX)
  and the directory fsynced: a process killed at any instant leaves the previous file intact.
  A checkpoint that cannot be read raises `CheckpointReadError` naming the file and the reason; one
  that cannot be written (disk full, a directory that cannot be written) `CheckpointWriteError`, naming
  the directory, the space the checkpoint needs and the space free, after removing the temporary file.
  (Lightning's own writer stages the file in the system temp directory, so its final move can be
  a non-atomic copy across file systems, and it never fsyncs.)
- `read_sharded_weights` / `load_checkpoint_weights`: the weights of a `.ckpt` file or of the
  directory of per-rank shards a sharded (FSDP2) run writes, read in one process.
"""

from __future__ import annotations

import contextlib
import os
import shutil
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


class CheckpointNotFoundError(FileNotFoundError):
    """A checkpoint named by path does not exist; the message says what the directory holds instead."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, a directory that cannot be written); the previous file with
    its name, if there was one, is intact and no temporary file is left."""


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
        partial = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}{PARTIAL_SUFFIX}")
        try:
            os.makedirs(directory, exist_ok=True)
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError as error:
            raise CheckpointWriteError(unwritable_directory_message(directory, error)) from error
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, path)
        except BaseException as error:
            try:
                os.unlink(partial)
            except OSError:
                pass
            cause = _os_error_in(error) if isinstance(error, Exception) else None
            if cause is None:
                raise
            # torch.save reports a failed write as its own RuntimeError, with the OSError only as its context
            message = failed_write_message(path, cause, checkpoint_bytes(checkpoint), os.path.exists(path))
            raise CheckpointWriteError(message) from error
        fsync_directory(directory)

    def load_checkpoint(
        self, path, map_location=lambda storage, loc: storage, weights_only: bool | None = None
    ) -> dict[str, Any]:
        if is_local(path):
            local = str(path).removeprefix("file://")
            if not os.path.exists(local):
                raise CheckpointNotFoundError(missing_checkpoint_message(local))
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


def check_checkpoint_path(ckpt_path) -> None:
    """Raise `CheckpointNotFoundError` when `ckpt_path` names a local file or directory that does not exist
    (`last`, `best`, `hpc` and URLs are resolved later, by the trainer)."""
    if ckpt_path is None or str(ckpt_path) in ("last", "best", "hpc") or not is_local(ckpt_path):
        return
    local = str(ckpt_path).removeprefix("file://")
    if not os.path.exists(local):
        raise CheckpointNotFoundError(missing_checkpoint_message(local))


def missing_checkpoint_message(path: str) -> str:
    """`checkpoint PATH does not exist` and, on a second line, what its directory holds (or that it does not exist)."""
    parent = Path(path).parent
    lines = [f"checkpoint {path} does not exist"]
    if parent.is_dir():
        found = sorted(
            child.name for child in parent.iterdir() if child.suffix == ".ckpt" and not child.name.startswith(".")
        )
        shown = ", ".join(found[:6]) + (f" and {len(found) - 6} more" if len(found) > 6 else "")
        lines.append(f"{parent} holds {shown}" if found else f"{parent} holds no .ckpt file")
    else:
        lines.append(f"there is no directory {parent}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- write failures


def checkpoint_bytes(checkpoint: Any) -> int:
    """About the bytes `torch.save(checkpoint)` writes: the storages of its tensors, each counted once (the
    pickled rest is small)."""
    total, seen, stack = 0, set(), [checkpoint]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            try:
                storage = item.untyped_storage()
                key = (storage.data_ptr(), str(item.device))
                if key not in seen:
                    seen.add(key)
                    total += storage.nbytes()
            except (RuntimeError, NotImplementedError):  # tensors without storage (meta, some subclasses)
                total += item.numel() * item.element_size()
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return total


def free_bytes(directory: str | Path) -> int | None:
    """Bytes free for this user on the file system of `directory` (or of its nearest existing parent)."""
    path = Path(directory).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def format_bytes(count: int | None) -> str:
    if count is None:
        return "an unknown amount"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} bytes"


def failed_write_message(path: str, error: OSError, needed: int, previous: bool = True) -> str:
    """Two lines: what failed, then where, how much space the checkpoint needs and how much is free, and whether a
    `previous` checkpoint with that name is left intact (or there was none)."""
    directory = os.path.dirname(path)
    reason = error.strerror or str(error)
    space = f"the checkpoint needs about {format_bytes(needed)}, {format_bytes(free_bytes(directory))} free"
    left = "the previous checkpoint is intact" if previous else "there was no earlier checkpoint of that name"
    return f"cannot write checkpoint {path}: {reason}\nin {directory}: {space}; {left}"


def unwritable_directory_message(directory: str, error: OSError) -> str:
    """Why no file can be created in `directory`: a parent that is a file, or the system's reason."""
    path = Path(directory)
    for parent in (path, *path.parents):
        if parent.exists():
            if not parent.is_dir():
                return f"cannot write checkpoints to {directory}: {parent} is a file, not a directory"
            break
    return f"cannot write checkpoints to {directory}: {error.strerror or error}"


def check_writable_directory(directory: str | Path) -> None:
    """Create `directory` and a file in it (removed at once), or raise `CheckpointWriteError` saying why not."""
    directory = os.path.abspath(str(directory))
    # Not named like a partial checkpoint: rank 0 sweeps those away while the other ranks run this check.
    probe = os.path.join(directory, f".write_check.{uuid.uuid4().hex}")
    try:
        os.makedirs(directory, exist_ok=True)
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(probe)
    except OSError as error:
        raise CheckpointWriteError(unwritable_directory_message(directory, error)) from error


def _os_error_in(error: BaseException) -> OSError | None:
    """The first `OSError` in `error`'s chain of causes and contexts (itself included)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError):
            return error
        error = error.__cause__ or error.__context__
    return None


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
        raise CheckpointNotFoundError(missing_checkpoint_message(str(ckpt_path)))
    # a run's own checkpoint: its hyper-parameters hold Python objects (SamplingConfig), so not weights_only
    checkpoint = AtomicCheckpointIO().load_checkpoint(path, map_location="cpu", weights_only=False)
    if "state_dict" not in checkpoint:
        raise ValueError(f"{path} is not a Lightning checkpoint (it has no 'state_dict')")
    try:
        module.load_state_dict(checkpoint["state_dict"], strict=True)
    except RuntimeError as error:
        raise RuntimeError(f"the weights in {path} do not fit the module the config builds: {error}") from error
    return "full"

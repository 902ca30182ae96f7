"""`RunLock`: one run at a time writes a checkpoint directory.

`rlvr fit` locks every directory its checkpoints go to before anything is built: the file `<directory>.lock`
beside it (`runs/grpo/checkpoints.lock`) names the run that holds it (process id, host, start time, command)
and carries an exclusive `flock`, which the kernel releases however the process ends (an error, Ctrl-C, a
crash, SIGKILL). A second run that finds the lock held stops at once with `RunDirectoryLocked`. The holder
removes the file when it ends; a file still there when its lock is free was left by a process that died, and
is taken over (`acquire` returns that process's description for the message).

Under DDP, on one node or several, the run holds one lock, taken by the process of global rank 0
(`is_global_rank_zero`, read from the launchers' variables before the trainer exists); the other ranks, which
write into the same directories, take none. On a file system without `flock` the file's process id is checked
instead: a live process on this host holds it, a dead one left it; one on another host cannot be checked and
holds it until the file is deleted.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from rlvr_lightning.runtime.checkpoint_files import CheckpointWriteError, unwritable_directory_message

# the variables the launchers (Lightning's, torchrun, SLURM, MPI, LSF) set to a process's rank, node or local rank
RANK_VARIABLES = (
    "RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID", "SLURM_NODEID", "OMPI_COMM_WORLD_RANK",
    "PMI_RANK", "JSM_NAMESPACE_RANK",
)  # fmt: skip
NO_FLOCK = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)
RUN_NAME_TIP = "choose another name for this run with --run_name NAME"
DIRPATH_TIP = "give this run's checkpoint callback another dirpath"


class RunDirectoryLocked(RuntimeError):
    """Another run holds the lock of a checkpoint directory; the message names it and what to do instead."""

    def __init__(self, directory: str, holder: dict, rename: str = RUN_NAME_TIP, unverifiable: bool = False) -> None:
        self.directory, self.holder = directory, holder
        tip = f"{rename}, or resume that run with --ckpt_path last once it has ended"
        if unverifiable:
            tip += f" (if no run is going on there, delete {lock_path(directory)})"
        super().__init__(f"{directory} is in use by another run: {describe(holder)}\n{tip}")


def is_global_rank_zero() -> bool:
    """Whether this process is global rank 0 of its run: every rank variable a launcher sets is 0 or unset."""
    for name in RANK_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) != 0:
            return False
    return True


def lock_path(directory: str | Path) -> Path:
    """`<directory>.lock`, beside the directory (a file inside it would count as a checkpoint directory's content)."""
    directory = Path(directory)
    return directory.with_name(directory.name + ".lock")


def describe(holder: dict) -> str:
    """`process 123 on host-a, started 2025-01-31 12:00:00` (what a lock file says of its holder)."""
    text = f"process {holder.get('pid', '?')}"
    if holder.get("host"):
        text += f" on {holder['host']}"
    if holder.get("started"):
        text += f", started {holder['started']}"
    return text


class RunLock:
    """The lock of the checkpoint directory `directory`: `acquire` once, `release` when the run ends."""

    def __init__(self, directory: str | Path, rename: str = RUN_NAME_TIP) -> None:
        """`rename`: how to give a second run another directory (the first part of `RunDirectoryLocked`'s tip)."""
        self.directory = os.path.realpath(str(directory))
        self.path = lock_path(self.directory)
        self.rename = rename
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> dict | None:
        """Take the lock, or raise `RunDirectoryLocked`; returns the holder a dead process left in the file (the
        lock is taken over from it), else None."""
        while True:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as error:  # checkpoints could not be written there either: say so now
                raise CheckpointWriteError(unwritable_directory_message(self.directory, error)) from error
            try:
                previous = self._lock(fd)
            except BaseException:
                os.close(fd)
                raise
            if _is_file_at(fd, self.path):
                break
            os.close(fd)  # its holder removed the file between our open and our lock: lock the new one
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(this_process()).encode(), 0)
        self._fd = fd
        return previous

    def _lock(self, fd: int) -> dict | None:
        """Lock `fd` (or raise `RunDirectoryLocked`); returns the holder a dead process left in it, else None."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirectoryLocked(self.directory, _read(fd), self.rename) from None
        except OSError as error:
            if error.errno not in NO_FLOCK:
                raise
            return self._check_process(_read(fd))
        return _read(fd) or None

    def _check_process(self, holder: dict) -> dict | None:
        """Without `flock`: the holder's process id, checked on this host (one on another host cannot be)."""
        if not holder or (holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname()):
            return None
        if holder.get("host") != socket.gethostname():
            raise RunDirectoryLocked(self.directory, holder, self.rename, unverifiable=True)
        if _process_exists(holder.get("pid")):
            raise RunDirectoryLocked(self.directory, holder, self.rename)
        return holder

    def release(self) -> None:
        """Remove the lock file and unlock (a no-op when not held)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            if _is_file_at(fd, self.path):
                os.unlink(self.path)
        except OSError:
            pass
        finally:
            os.close(fd)  # unlocks


def this_process() -> dict:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join(sys.argv)[:500],
    }


def _read(fd: int) -> dict:
    try:
        text = os.pread(fd, 65536, 0).decode("utf-8", "replace")
        holder = json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        return {"pid": "unknown (unreadable lock file)"}
    return holder if isinstance(holder, dict) else {"pid": "unknown (unreadable lock file)"}


def _is_file_at(fd: int, path: Path) -> bool:
    """Whether the open file `fd` is the file now at `path` (not one removed or replaced since it was opened)."""
    try:
        opened, current = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (opened.st_dev, opened.st_ino) == (current.st_dev, current.st_ino)


def _process_exists(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True

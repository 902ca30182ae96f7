"""Where a run's checkpoints go, so that the same command finds them again with `--ckpt_path last`.

`rlvr` gives every `ModelCheckpoint` without a `dirpath` the run's checkpoint directory,
`<trainer.default_root_dir>/<run name>/checkpoints`. The run name is `run_name` (an option of `rlvr`) or
the names of the `--config` files joined by `+` (`grpo`, `gsm8k_qwen2.5_math_1.5b+fsdp2`); never a logger's
version or random id (Lightning's default), which differs on every start. A run whose callbacks hold no
`ModelCheckpoint`, e.g. because a later `--config` replaced the list, gets `default_checkpoint`. Every
`ModelCheckpoint` overwrites its files instead of writing `last-v1.ckpt` beside `last.ckpt`: the newest
state of a run is always `last.ckpt`. `rlvr fit` locks the directories `configured_directories` finds before
anything is built (`run_lock`): one run at a time writes them.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Sequence
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint

from rlvr_lightning.callbacks.checkpointing import RolloutCheckpoint
from rlvr_lightning.runtime.checkpoint_files import is_local

DEFAULT_EVERY_N_ROLLOUT_STEPS = 100


def run_name(config_files: Sequence[object], explicit: str | None = None) -> str:
    """`explicit`, else the stems of the config files joined by "+" (files only; "run" when there are none)."""
    if explicit is not None:
        name = str(explicit)
        if not name.strip() or name in (".", "..") or "/" in name or os.sep in name:
            raise ValueError(f"run_name={name!r} must be a plain name (no '/'): the folder of the run's checkpoints")
        return name
    stems = [Path(str(path)).stem for path in config_files if path is not None and str(path).strip()]
    stems = [re.sub(r"[^\w.+-]", "_", stem) for stem in stems if stem]
    return "+".join(stems) or "run"


def checkpoint_directory(root: str | Path | None, name: str) -> str:
    """`<root>/<name>/checkpoints`, absolute (as `ModelCheckpoint` keeps its `dirpath`)."""
    return os.path.realpath(os.path.join(str(root or "."), name, "checkpoints"))


def default_checkpoint(directory: str) -> RolloutCheckpoint:
    """`last.ckpt` in `directory` every `DEFAULT_EVERY_N_ROLLOUT_STEPS` rollout steps and at every epoch end."""
    return RolloutCheckpoint(
        dirpath=directory,
        every_n_rollout_steps=DEFAULT_EVERY_N_ROLLOUT_STEPS,
        every_n_epochs=1,
        save_on_train_epoch_end=True,
        save_last=True,
        save_top_k=0,
        enable_version_counter=False,
    )


def place_checkpoints(callbacks: Sequence[pl.Callback], directory: str, enabled: bool = True) -> list[pl.Callback]:
    """Point the `ModelCheckpoint`s of `callbacks` without a `dirpath` at `directory` and make every one of them
    overwrite its files; returns the callbacks to add (a `default_checkpoint` when checkpointing is `enabled`
    and `callbacks` have no `ModelCheckpoint`)."""
    checkpoints = [callback for callback in callbacks if isinstance(callback, ModelCheckpoint)]
    for callback in checkpoints:
        if callback.dirpath is None:
            callback.dirpath = directory
        callback._enable_version_counter = False  # last.ckpt, never last-v1.ckpt beside a stale last.ckpt
    if checkpoints or not enabled:
        return []
    return [default_checkpoint(directory)]


def configured_directories(callback_sections: object, directory: str, enabled: bool = True) -> dict[str, bool]:
    """The checkpoint directories a run will write, read from its config before anything is built, each with
    whether the run's name chose it: the `dirpath` of each `ModelCheckpoint` section of `callback_sections`
    (`trainer.callbacks` as dicts; False), and `directory`, the run's (True), when a `ModelCheckpoint` has no
    `dirpath` or there is none (`place_checkpoints`)."""
    if not enabled:
        return {}
    sections = callback_sections if isinstance(callback_sections, list) else [callback_sections]
    checkpoints = [s for s in sections if isinstance(s, dict) and _is_model_checkpoint(s.get("class_path"))]
    dirpaths = [(section.get("init_args") or {}).get("dirpath") for section in checkpoints]
    found = {directory: True} if (not checkpoints or None in dirpaths) and is_local(directory) else {}
    found.update({os.path.realpath(str(path)): False for path in dirpaths if path is not None and is_local(path)})
    return found


def _is_model_checkpoint(class_path: object) -> bool:
    if not isinstance(class_path, str) or "." not in class_path:
        return False
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except Exception:  # noqa: BLE001 - the parser reports a class that cannot be imported
        return False
    return isinstance(cls, type) and issubclass(cls, ModelCheckpoint)


def earlier_checkpoints(callbacks: Sequence[pl.Callback]) -> list[str]:
    """The `last.ckpt` files already in the directories of the `ModelCheckpoint`s of `callbacks`."""
    found = []
    for callback in callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath:
            last = os.path.join(str(callback.dirpath), callback.CHECKPOINT_NAME_LAST + callback.FILE_EXTENSION)
            if os.path.exists(last) and last not in found:
                found.append(last)
    return found

"""Callbacks for runs that resume exactly.

- `ResumeState`: callback that puts the RNG states (torch, CUDA, numpy, python; every rank's)
  in each checkpoint and restores them right before the first training batch after a resume;
  keeps what runs between training steps (validation, curriculum refreshes, dataloader seed
  draws) from consuming the training RNG streams; installs `AtomicCheckpointIO`
  (`rlvr_lightning.runtime.checkpoint_files`) when the strategy uses Lightning's default `TorchCheckpointIO`;
  before training, checks that every checkpoint directory can be written;
  under DDP gives each rank > 0 its own sampling seed. `rlvr` adds one to the trainer.
- `RolloutCheckpoint`: `ModelCheckpoint` counting rollout steps (training batches) instead of
  optimizer steps, which differ when `update.epochs` or mini-batches make several updates per step;
  `keep_last=k` keeps the k newest periodic checkpoints.
"""

from __future__ import annotations

import logging
import os
import random
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn

from rlvr_lightning.runtime.checkpoint_files import (
    AtomicCheckpointIO,
    CheckpointReadError,
    check_writable_directory,
    is_local,
    remove_partial_checkpoints,
)

__all__ = ["AtomicCheckpointIO", "CheckpointReadError", "ResumeState", "RolloutCheckpoint"]

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- RNG states


def capture_rng_state() -> dict[str, Any]:
    """The global RNG states, as plain types and tensors (loadable with `weights_only=True`)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "name": name,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def capture_torch_rng_state() -> dict[str, Any]:
    """Only torch's generators (CPU and CUDA): ~20 us, cheap enough for every step."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore what `state` holds (all generators, or only torch's)."""
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        numpy = state["numpy"]
        np.random.set_state(
            (
                numpy["name"],
                numpy["keys"].numpy().astype(np.uint32),
                numpy["pos"],
                numpy["has_gauss"],
                numpy["cached_gaussian"],
            )
        )
    if "python" in state:
        python = state["python"]
        random.setstate((python[0], tuple(python[1]), python[2]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class ResumeState(Callback):
    """RNG states in checkpoints, restored exactly where training left them.

    Torch's RNG streams (CPU, CUDA: what sampling and mini-batch shuffling draw from) are frozen
    between training steps: the state a step ends with is the state the next step starts with,
    whatever ran in between (validation, a curriculum refresh, a dataloader's seed draw at an
    epoch start). A checkpoint holds that state and the python and numpy states of the
    checkpoint instant, so a run resumed from it draws exactly what the uninterrupted run drew.
    (python's and numpy's generators are not frozen per step: reading numpy's state costs
    ~0.3 ms; nothing in rlvr_lightning draws from them between steps.) `rlvr` puts it first among
    the callbacks, so that a callback drawing random numbers at the start of a step (A*-PO's
    reference samples) draws them after the restore.
    """

    def __init__(
        self, atomic_checkpoints: bool = True, per_rank_seeds: bool = True, freeze_between_steps: bool = True
    ) -> None:
        """
        Args:
            atomic_checkpoints: install `AtomicCheckpointIO` when the strategy has Lightning's default IO.
            per_rank_seeds: under DDP, reseed ranks > 0 at the start of a fresh run, so that ranks do not
                draw the same random numbers (rank 0 keeps the run's seed).
            freeze_between_steps: restore, at the start of every training step, the torch RNG states the
                previous step ended with. Without it, the RNG use between the checkpoint and the next step
                must be the same in the resumed run for it to match bit for bit.
        """
        self.atomic_checkpoints = atomic_checkpoints
        self.per_rank_seeds = per_rank_seeds
        self.freeze_between_steps = freeze_between_steps
        self._trainer: pl.Trainer | None = None
        self._step_end_state: dict[str, Any] | None = None  # RNG states as the last training step left them
        self._pending: dict[str, Any] | None = None  # loaded from a checkpoint, applied at the next training step

    # ------------------------------------------------------------------ set-up

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer
        strategy = trainer.strategy
        if self.atomic_checkpoints and type(strategy.checkpoint_io) is TorchCheckpointIO:
            strategy.checkpoint_io = AtomicCheckpointIO()
        for callback in trainer.checkpoint_callbacks:
            dirpath = getattr(callback, "dirpath", None)
            if not dirpath or not is_local(dirpath):
                continue
            if stage == TrainerFn.FITTING:  # a directory that cannot be written fails now, not at the first save
                check_writable_directory(str(dirpath).removeprefix("file://"))
            if trainer.is_global_zero:
                for path in remove_partial_checkpoints(dirpath):
                    log.info("removed a partial checkpoint left by a killed write: %s", path)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.per_rank_seeds and trainer.world_size > 1 and trainer.global_rank > 0 and self._pending is None:
            base = int(os.environ.get("PL_GLOBAL_SEED", 0))
            _seed_all(base + 1_000_003 * trainer.global_rank)

    # ------------------------------------------------------------------ steps

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._pending is not None:
            states, self._pending = self._pending["rng_states"], None
            if len(states) != trainer.world_size:
                rank_zero_warn(
                    f"the checkpoint holds RNG states of {len(states)} rank(s), this run has {trainer.world_size}: "
                    "ranks without a saved state keep their seeds; the resumed run will not match bit for bit"
                )
            if trainer.global_rank < len(states):
                restore_rng_state(states[trainer.global_rank])
        elif self.freeze_between_steps and self._step_end_state is not None:
            restore_rng_state(self._step_end_state)
        self._step_end_state = None

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch: Any, batch_idx: int
    ) -> None:
        if self.freeze_between_steps:
            self._step_end_state = capture_torch_rng_state()

    # ------------------------------------------------------------------ checkpoint

    def state_dict(self) -> dict[str, Any]:
        state = capture_rng_state()
        if self._step_end_state is not None:  # between steps: torch's state is the one the last step ended with
            state.update(self._step_end_state)
        trainer = self._trainer
        if (
            trainer is not None
            and trainer.world_size > 1
            and torch.distributed.is_available()
            and torch.distributed.is_initialized()
        ):
            states: list[Any] = [None] * trainer.world_size
            torch.distributed.all_gather_object(states, state)
            return {"rng_states": states}
        return {"rng_states": [state]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = state_dict


class RolloutCheckpoint(ModelCheckpoint):
    """`ModelCheckpoint` saving every `every_n_rollout_steps` training batches (rollout steps).

    Lightning's `every_n_train_steps` counts optimizer steps, which an RL step makes several of
    (`update.epochs` x mini-batches). Other arguments are `ModelCheckpoint`'s; the file name may use
    `{rollout_step}` (default `"{epoch}-{rollout_step}"`). With `every_n_epochs` unset it does not
    save at epoch ends. `keep_last=k` keeps the k newest of the periodic checkpoints and deletes older ones
    (it sets `monitor="rollout_step", mode="max", save_top_k=k`); `last.ckpt` (`save_last`) is the newest.
    """

    def __init__(
        self,
        every_n_rollout_steps: int = 100,
        filename: str | None = "{epoch}-{rollout_step}",
        keep_last: int | None = None,
        **kwargs,
    ) -> None:
        if every_n_rollout_steps < 1:
            raise ValueError(f"every_n_rollout_steps must be >= 1, got {every_n_rollout_steps}")
        if keep_last is not None:
            if keep_last < 1:
                raise ValueError(f"keep_last must be >= 1 (the periodic checkpoints kept), got {keep_last}")
            if kwargs.get("monitor") not in (None, "rollout_step"):
                raise ValueError(
                    f"keep_last keeps the newest checkpoints: give it without monitor={kwargs['monitor']!r}"
                )
            kwargs.update(monitor="rollout_step", mode="max", save_top_k=keep_last)
        if kwargs.get("every_n_train_steps"):
            raise ValueError(
                "RolloutCheckpoint counts rollout steps: use every_n_rollout_steps, not every_n_train_steps"
            )
        kwargs.setdefault("every_n_epochs", 0)
        super().__init__(filename=filename, every_n_train_steps=0, **kwargs)
        self.every_n_rollout_steps = every_n_rollout_steps
        self._last_rollout_step_saved = -1

    def _monitor_candidates(self, trainer: pl.Trainer) -> dict[str, torch.Tensor]:
        candidates = super()._monitor_candidates(trainer)
        candidates["rollout_step"] = torch.tensor(trainer.fit_loop.epoch_loop._batches_that_stepped + 1)
        return candidates

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        if trainer.fast_dev_run or trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking:
            return
        step = trainer.fit_loop.epoch_loop._batches_that_stepped + 1  # rollout steps completed, this one included
        if step % self.every_n_rollout_steps or step == self._last_rollout_step_saved:
            return
        self._last_rollout_step_saved = step
        candidates = self._monitor_candidates(trainer)
        self._save_topk_checkpoint(trainer, candidates)
        self._save_last_checkpoint(trainer, candidates)

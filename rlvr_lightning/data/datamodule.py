"""`RLVRDataModule`: batches of prompts from a `Task` for training and validation.

Training prompts are read from an endless, indexable view of the task's training data
(`prompt_streams.py`), so a run's position is a few integers that checkpoints carry and a resumed
run continues from; over a finite dataset a Lightning epoch is `len(dataset) // (batch_size *
world_size)` batches. The data module counts consumed batches in `on_before_batch_transfer` (not
what the loader prefetched), which is what `state_dict` saves.

With a `DifficultyFilter` the training prompts are the kept prompts, reshuffled each pass, and
refreshed every `refresh_every_n_epochs` epochs through Lightning's dataloader reloading (the
module sets `trainer.reload_dataloaders_every_n_epochs = 1` and decides itself when a refresh is
due, so that resumed runs refresh at the same epochs). An epoch of filtered training is
`trainer.limit_train_batches` batches.

With `retire_solved` each epoch is one pass over the prompts the policy has not solved yet
(`retire_solved.py`, ScaleRL's no-positive-resampling); the module hands each step's rollout to
`retire_solved_prompts`.

`setup` rejects a prompt longer than the model's context before any batch is built
(`prompt_lengths`). The RNG states that exact resumes also need are `ResumeState`'s (a callback
`rlvr` adds).
"""

from __future__ import annotations

import logging
import os
from typing import Annotated, Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader

from rlvr_lightning.data.curriculum_report import publish_refresh
from rlvr_lightning.data.difficulty_filter import DifficultyFilter
from rlvr_lightning.data.prompt_lengths import check_prompt_lengths
from rlvr_lightning.data.prompt_streams import (
    TOPUP_OFFSET,
    IndexedStream,
    OffsetView,
    PromptStream,
    ReshuffledPool,
    ResumableLoader,
    SequentialStream,
    as_is,
    example_source,
)
from rlvr_lightning.data.retire_solved import IndexedSubset, Retirement
from rlvr_lightning.data.task import Example, Task, collate_examples
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import NON_NEGATIVE_INT, POSITIVE_INT, Range

log = logging.getLogger(__name__)

STATE_VERSION = 1


@documented_options
class RLVRDataModule(pl.LightningDataModule):
    def __init__(
        self,
        task: Task,
        batch_size: Annotated[
            int, Option("prompts per rank and step; each is sampled `group_size` times by the module.", POSITIVE_INT)
        ] = 16,
        val_batch_size: Annotated[
            int | None, Option("rows per validation batch (null: batch_size).", Range(1, integer=True, optional=True))
        ] = None,
        num_workers: Annotated[
            int, Option("DataLoader worker processes (0: load in the main process).", NON_NEGATIVE_INT)
        ] = 0,
        difficulty_filter: DifficultyFilter | None = None,
        seed: int | None = None,
        retire_solved: Annotated[
            float | None,
            Option(
                "retire a training prompt for good once its pass rate in a step reaches this (ScaleRL: 0.9); "
                "each epoch is then one pass over the prompts not retired; a finite dataset only; null: never.",
                Range(0, 1, low_open=True, optional=True),
            ),
        ] = None,
    ):
        """
        Args:
            difficulty_filter: best-of-n curriculum (see `DifficultyFilter`); None trains on every prompt.
            seed: shuffles finite datasets and the kept prompts; default the run's `seed_everything` seed.
        """
        super().__init__()
        check_options(RLVRDataModule, locals())
        if retire_solved is not None and difficulty_filter is not None:
            raise ValueError(
                f"data.retire_solved={retire_solved} cannot be combined with data.difficulty_filter (the filter "
                "draws its own prompts): set one of them null"
            )
        self.task = task
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size or batch_size
        self.num_workers = num_workers
        self.difficulty_filter = difficulty_filter
        self.seed = seed
        self._source = None
        self.source_position = 0  # examples of the task's training data consumed (training and candidates)
        self.pool_position = 0  # examples of the kept-prompt pool consumed since the last refresh
        self.topup_batches = 0  # top-up batches this rank drew since the last refresh (`topup_batch`)
        self._topup = None  # (pool key, view)
        self.retire_solved = retire_solved
        self.retirement = Retirement(retire_solved) if retire_solved is not None else None
        self._pass: tuple[int, ReshuffledPool] | None = None  # (epoch, its prompts) with retire_solved

    # ------------------------------------------------------------- set-up

    @property
    def data_seed(self) -> int:
        return self.seed if self.seed is not None else int(os.environ.get("PL_GLOBAL_SEED", 0))

    def _rank_world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def setup(self, stage: str) -> None:
        trainer = self.trainer
        if trainer is None:
            return
        if stage in ("fit", "validate") and trainer.lightning_module is not None:
            check_prompt_lengths(self.task, trainer.lightning_module)
        if stage == "fit" and self.retirement is not None:
            self._check_retirement(trainer)
        if stage == "fit" and self.difficulty_filter is None:
            self._training_batches()  # a task too small for one batch stops the run here, naming batch_size
        if stage == "fit" and self.difficulty_filter is not None:
            if not isinstance(trainer.limit_train_batches, int):
                raise ValueError(
                    "the difficulty filter trains on an endless stream of kept prompts: set "
                    "trainer.limit_train_batches to the rollout steps of one epoch (refreshes happen between epochs)"
                )
            if trainer.reload_dataloaders_every_n_epochs != 1:
                log.info("difficulty filter: setting trainer.reload_dataloaders_every_n_epochs = 1")
                trainer.reload_dataloaders_every_n_epochs = 1

    def _check_retirement(self, trainer) -> None:
        if self.source().finite_size is None:
            raise ValueError(
                f"data.retire_solved={self.retire_solved} needs a finite training dataset: "
                f"{type(self.task).__name__}'s is an endless stream, where no prompt comes back; set it null"
            )
        if not getattr(trainer.lightning_module, "reports_pass_rates", False):
            raise ValueError(
                f"data.retire_solved={self.retire_solved} needs a module that reports its prompts' pass rates "
                f"(RLVRModule, PPOModule); {type(trainer.lightning_module).__name__} does not"
            )
        if trainer.reload_dataloaders_every_n_epochs != 1:
            log.info("retire_solved: setting trainer.reload_dataloaders_every_n_epochs = 1 (one pass per epoch)")
            trainer.reload_dataloaders_every_n_epochs = 1

    def source(self):
        """The task's training data as an endless indexable view (built once)."""
        if self._source is None:
            self._source = example_source(self.task.train_dataset(), self.data_seed)
        return self._source

    # ------------------------------------------------------------- training data

    def _pool_active(self) -> bool:
        return self.difficulty_filter is not None and self.difficulty_filter.kept is not None

    def position(self) -> int:
        """The global example index the next training batch starts at, in the active pool."""
        return self.pool_position if self._pool_active() else self.source_position

    def train_prompts(self) -> PromptStream:
        """This rank's training prompts from the current position: the kept prompts, or the task's."""
        rank, world = self._rank_world()
        if self._pool_active():
            pool = ReshuffledPool(
                self.difficulty_filter.kept, self.data_seed * 7_919 + self.difficulty_filter.refresh_index
            )
            return PromptStream(pool, self.batch_size, rank, world, self.pool_position)
        source = self._train_source()
        return PromptStream(source, self.batch_size, rank, world, self.source_position, self._training_batches())

    def _train_source(self):
        """What the training batches read: the task's data, or with `retire_solved` this epoch's pass."""
        return self._retiring_pass() if self.retirement is not None else self.source()

    def _retiring_pass(self) -> ReshuffledPool:
        """This epoch's prompts, those not retired before it began, shuffled by (seed, epoch) (`retire_solved.py`);
        a new epoch starts reading them at 0. A RuntimeError when they make no global batch."""
        epoch = self.trainer.current_epoch if self.trainer is not None else 0
        if epoch != self.retirement.epoch:
            self.retirement.epoch, self.source_position = epoch, 0
        if self._pass is None or self._pass[0] != epoch:
            dataset = self.source().dataset
            active = self.retirement.active(len(dataset), epoch)
            world = self._rank_world()[1]
            if len(active) < min(self.batch_size * world, len(dataset)):  # too small a task: _training_batches
                raise RuntimeError(
                    f"data.retire_solved={self.retire_solved} has retired {len(dataset) - len(active)} of the "
                    f"{len(dataset)} training prompts before epoch {epoch}: the {len(active)} left make no batch of "
                    f"{self.batch_size} x {world} rank(s); the policy has solved the training set (train fewer "
                    "epochs, or raise data.retire_solved)"
                )
            self._pass = (epoch, ReshuffledPool(IndexedSubset(dataset, active), self.data_seed * 7_919 + epoch))
        return self._pass[1]

    def _training_batches(self) -> int | None:
        """The training batches of an epoch of the task's prompts (None: an endless task); a ValueError naming
        `batch_size` where they make none."""
        size, world = self._train_source().finite_size, self._rank_world()[1]
        if size is None:
            return None
        if size < self.batch_size * world:
            raise ValueError(
                f"batch_size={self.batch_size} is not valid: the task has {size} training prompt(s), fewer than "
                f"one batch of {self.batch_size} x {world} rank(s)"
            )
        return size // (self.batch_size * world)

    def train_dataloader(self) -> DataLoader:
        if self.difficulty_filter is not None:
            self._maybe_refresh()
        return ResumableLoader(
            self.train_prompts(),
            position=self.position,
            batch_size=None,  # the stream yields collated batches
            collate_fn=as_is,
            num_workers=self.num_workers,
            generator=torch.Generator(),  # the loader's base seed must not draw from the global RNG (exact resume)
        )

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        trainer = self.trainer
        if trainer is not None and trainer.training and not trainer.sanity_checking:
            consumed = self.batch_size * trainer.world_size
            if self._pool_active():
                self.pool_position += consumed
            else:
                self.source_position += consumed
        return batch

    def topup_batch(self) -> dict[str, list]:
        """`batch_size` more prompts for this rank (dynamic sampling tops a rollout up with them).

        They come from a part of the training data the regular batches do not read (an endless
        indexed stream from example 2**40 on; a finite dataset or the kept prompts in another
        shuffled order; any other stream read again from its start) and the count drawn is
        checkpointed per rank, so a resumed run draws the same top-ups.
        """
        rank, world = self._rank_world()
        key = self.difficulty_filter.refresh_index if self._pool_active() else None
        if self.retirement is not None:
            key = ("pass", self.retirement.epoch)  # top-ups: another shuffle of this epoch's prompts
        if self._topup is None or self._topup[0] != key:
            if self._pool_active():
                view = ReshuffledPool(self.difficulty_filter.kept, self.data_seed * 7_919 + key + 500_009)
            else:
                source = self._train_source()
                if isinstance(source, IndexedStream):
                    view = OffsetView(source, TOPUP_OFFSET)
                elif isinstance(source, ReshuffledPool):
                    view = ReshuffledPool(source.dataset, source.seed + 500_009)
                else:
                    view = SequentialStream(source.stream)
            self._topup = (key, view)
        first = (self.topup_batches * world + rank) * self.batch_size
        self.topup_batches += 1
        return collate_examples([self._topup[1][first + i] for i in range(self.batch_size)])

    # ------------------------------------------------------------- curriculum

    def _candidates(self) -> list[Example]:
        source, limit = self.source(), self.difficulty_filter.max_candidates
        if source.finite_size is not None and (limit is None or limit >= source.finite_size):
            return [source.dataset[i] for i in range(source.finite_size)]  # the whole pool, once each
        if limit is None:
            raise ValueError("difficulty_filter.max_candidates must be set for an endless training stream")
        candidates = [source[self.source_position + i] for i in range(limit)]
        self.source_position += limit
        return candidates

    def _maybe_refresh(self) -> None:
        trainer, flt = self.trainer, self.difficulty_filter
        if trainer is None:
            raise RuntimeError(
                "the difficulty filter samples with the trained policy: attach the data module to a Trainer"
            )
        epoch = trainer.current_epoch
        if not flt.refresh_due(epoch):
            return
        module = trainer.lightning_module
        rank, world = self._rank_world()
        candidates = self._candidates()
        min_kept = flt.min_kept if flt.min_kept is not None else self.batch_size * world
        stats = flt.refresh(
            module,
            candidates,
            epoch=epoch,
            seed=self.data_seed,
            rank=rank,
            world_size=world,
            trainer=trainer,
            min_kept=min_kept,
        )
        self.pool_position = 0
        self.topup_batches = 0
        stats.update(self.task.update_difficulty(flt.candidates, flt.pass_counts, flt.n))
        for reward in getattr(module, "reward_callbacks", []):
            stats[f"curriculum/reward_errors/{reward.name}"] = float(reward.pop_errors())
        publish_refresh(self.trainer, self.difficulty_filter, stats)

    # ------------------------------------------------------------- validation

    def val_dataloader(self) -> DataLoader | list:
        dataset = self.task.val_dataset()
        if dataset is None:
            return []
        return DataLoader(
            dataset,
            batch_size=self.val_batch_size,
            collate_fn=collate_examples,
            num_workers=self.num_workers,
            generator=torch.Generator(),  # no draw from the global RNG
        )

    def predict_dataloader(self) -> DataLoader | list:
        """`rlvr predict` completes the held-out prompts."""
        return self.val_dataloader()

    # ------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Called on every rank when a checkpoint is saved: the top-up counts, which differ by rank, are gathered."""
        topups = [self.topup_batches]
        trainer = self.trainer
        if (
            trainer is not None
            and trainer.world_size > 1
            and torch.distributed.is_available()
            and torch.distributed.is_initialized()
        ):
            topups = [None] * trainer.world_size
            torch.distributed.all_gather_object(topups, self.topup_batches)
        return {
            "version": STATE_VERSION,
            "source_position": self.source_position,
            "pool_position": self.pool_position,
            "topup_batches": topups,  # per rank
            "curriculum": self.difficulty_filter.state_dict() if self.difficulty_filter is not None else None,
            "task": self.task.state_dict(),
            "retirement": self.retirement.state_dict() if self.retirement is not None else None,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.source_position = int(state_dict["source_position"])
        self.pool_position = int(state_dict["pool_position"])
        topups = state_dict.get("topup_batches", [0])
        rank = self.trainer.global_rank if self.trainer is not None else 0
        self.topup_batches = int(topups[rank]) if rank < len(topups) else 0
        self.task.load_state_dict(state_dict.get("task", {}))
        self._load_retirement(state_dict.get("retirement"))
        curriculum = state_dict.get("curriculum")
        if self.difficulty_filter is not None and curriculum is not None:
            self.difficulty_filter.load_state_dict(curriculum)
        elif self.difficulty_filter is not None:
            rank_zero_warn("the checkpoint has no curriculum state: the difficulty filter starts afresh")
        elif curriculum is not None and curriculum.get("kept") is not None:
            rank_zero_warn(
                "the checkpoint was trained with a difficulty filter; this run has none: training on every prompt"
            )

    def _load_retirement(self, state: dict[str, Any] | None) -> None:
        self._pass = None
        if self.retirement is not None and state is not None:
            self.retirement.load_state_dict(state)
        elif self.retirement is not None:
            rank_zero_warn("the checkpoint has no retired prompts (retire_solved was off): retiring from here on")
            self.retirement.epoch = -1  # its position was not within a pass: this epoch's pass starts at 0
        elif state is not None and state["retired"]:
            rank_zero_warn(
                f"the checkpoint retired {len(state['retired'])} solved prompt(s); this run has retire_solved off: "
                "training on every prompt"
            )

"""Retire the training prompts the policy has solved (`RLVRDataModule(retire_solved=0.9)`).

ScaleRL's "no-positive-resampling" (Khatri et al. 2025, arXiv:2510.13786, sec. 3.2): a prompt whose pass rate
in a training step reaches the threshold (0.9 there) is never drawn again in later epochs of a finite
training set.

- Pass rate: a prompt's responses in the step's rollout, as sampled and scored (before dynamic sampling drops
  zero-variance groups; top-up prompts do not count); a response passes when the run's task reward calls it
  correct (the module's `correctness`, `is_correct`). A rate exactly at the threshold retires.
- Identity: the prompt's index in the task's training dataset, which the pass's prompts carry in their
  metadata under `PROMPT_INDEX_KEY`.
- Schedule: each Lightning epoch is one pass over the prompts not retired when it began, shuffled by
  (seed, epoch); the last fewer-than-one-global-batch prompts of the shuffle wait for a later pass. A prompt
  retired in epoch e has already been drawn in it (once: a pass draws each prompt once) and is absent from
  epoch e + 1 on, top-ups included. The data loader may build batches ahead of the training steps, so no
  retirement can change the pass being drawn. An epoch cut short by `trainer.limit_train_batches` ends its
  pass there. With `rollout_staleness` a rollout trained in the epoch after the one it was drawn in retires its
  prompts from the epoch after that.
- DDP: every rank's pass counts are all-gathered each step, so every rank retires the same prompts and draws
  the same passes; batches keep their size. When the prompts left make no global batch, the run stops with
  an error.
- State: `{dataset index: epoch it was retired in}`. Epoch e's prompts are a function of it (those retired
  before e are out), so a run resumed mid-epoch draws exactly what the uninterrupted run draws.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from rlvr_lightning.data.task import Example
from rlvr_lightning.runtime.distributed import all_gather

PROMPT_INDEX_KEY = "dataset_index"  # the metadata key of a training prompt's index in the task's dataset


class IndexedSubset(Dataset):
    """Examples `indices` of `dataset`, each with its dataset index in `PROMPT_INDEX_KEY`."""

    def __init__(self, dataset, indices: list[int]) -> None:
        self.dataset = dataset
        self.indices = indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, position: int) -> Example:
        index = self.indices[position]
        example = self.dataset[index]
        if PROMPT_INDEX_KEY in example:
            raise ValueError(
                f"data.retire_solved marks each training prompt with its index under {PROMPT_INDEX_KEY!r}, which "
                f"training example {index} already has: rename that field"
            )
        return {**example, PROMPT_INDEX_KEY: index}


class Retirement:
    """The retired prompts of a finite training set and the epoch each was retired in (checkpointed)."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.retired: dict[int, int] = {}  # dataset index -> epoch of the step that retired it
        self.epoch = 0  # the epoch whose pass the data module draws (its position counts within that pass)

    def active(self, size: int, epoch: int) -> list[int]:
        """The dataset indices epoch `epoch` draws: every prompt not retired before it began."""
        return [i for i in range(size) if self.retired.get(i, epoch) >= epoch]

    def record(self, counts: Tensor, epoch: int) -> int:
        """Retire, in `epoch`, the prompts of `counts` (`long[K, 3]`: dataset index, passes, responses; rows of
        one index summed) whose pass rate reaches the threshold; returns how many were newly retired."""
        totals: dict[int, list[int]] = {}
        for index, passes, responses in counts.tolist():
            total = totals.setdefault(index, [0, 0])
            total[0], total[1] = total[0] + passes, total[1] + responses
        new = 0
        for index, (passes, responses) in sorted(totals.items()):
            # ScaleRL sec. 3.2: pass rate >= 0.9 -> never resampled (a float division is exact at the boundary)
            if index not in self.retired and responses and passes / responses >= self.threshold:
                self.retired[index] = epoch
                new += 1
        return new

    def state_dict(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "retired": dict(self.retired), "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.retired = {int(index): int(epoch) for index, epoch in state["retired"].items()}
        self.epoch = int(state["epoch"])


def prompt_pass_counts(rollout, correct: Tensor) -> Tensor:
    """`long[K, 3]`: each prompt of the rollout (its contiguous run of rows) as (dataset index, passes, responses)."""
    runs = rollout.prompt_runs()
    run, starts = runs.row_run.cpu(), runs.first_rows.cpu()
    counts = torch.bincount(run, minlength=len(starts))
    passes = torch.zeros(len(starts), dtype=torch.long).index_add_(0, run, correct.detach().cpu().long())
    indices = []
    for row in starts.tolist():
        metadata = rollout.metadata[row] if rollout.metadata else {}
        if PROMPT_INDEX_KEY not in metadata:
            raise ValueError(
                f"data.retire_solved: a trained row's metadata has no {PROMPT_INDEX_KEY!r} (its prompt did not come "
                "from RLVRDataModule's training passes)"
            )
        indices.append(int(metadata[PROMPT_INDEX_KEY]))
    return torch.stack([torch.tensor(indices, dtype=torch.long), passes, counts.long()], dim=1)


def retire_solved_prompts(module, rollout) -> dict[str, float]:
    """`RLVRModule.training_step` hands its scored rollout here: with `data.retire_solved` set, the prompts it
    solved are retired on every rank (the counts all-gathered); returns `train/retired_prompts` ({} when off)."""
    trainer = module.trainer
    retirement = getattr(trainer.datamodule, "retirement", None)
    if retirement is None:
        return {}
    if rollout.demonstration_rows is not None:  # a demonstration from the data is not a solve of the policy's
        rollout = rollout.select(~rollout.demonstration_rows)
    correct = module.correctness(rollout)
    if correct is None:
        raise ValueError(
            "data.retire_solved retires prompts by pass rate, but no reward of kind 'task' can tell a correct "
            "response (is_correct): add the task's reward or set data.retire_solved null"
        )
    counts = prompt_pass_counts(rollout, correct)
    if trainer.world_size > 1:  # the same retirements on every rank
        counts = all_gather(trainer, counts.to(module.device)).reshape(-1, 3).cpu()
    retirement.record(counts, trainer.current_epoch)
    return {"train/retired_prompts": float(len(retirement.retired))}

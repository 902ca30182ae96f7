"""Training prompts as endless views read by global example index, and the batches of one rank.

- an endless stream with `example_at(i)` (`IndexedStream`) is read by index;
- any other `IterableDataset` is read in order (`SequentialStream`: resuming skips what was
  consumed; worker processes are not supported for it);
- a finite dataset is read as an endless sequence of passes, each shuffled by (seed, pass)
  (`ReshuffledPool`).

Under DDP, rank r's share of global batch j is examples `[(j * world + r) * B, ... + B)`; with
worker processes, worker w produces the batches j = w (mod num_workers), so the examples and
their order do not depend on `num_workers` (`PromptStream`). `ResumableLoader` starts every
iteration at the position the data module holds.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from rlvr_lightning.data.task import Example, collate_examples


class IndexedStream:
    """A stream read by index through its `example_at`."""

    finite_size = None

    def __init__(self, stream: IterableDataset) -> None:
        self.stream = stream

    def __getitem__(self, index: int) -> Example:
        return self.stream.example_at(index)


class SequentialStream:
    """Any other stream, read in order; going back restarts it."""

    finite_size = None
    indexed = False

    def __init__(self, stream: IterableDataset) -> None:
        self.stream = stream
        self._iterator = None
        self._next = 0

    def __getstate__(self) -> dict[str, Any]:
        return {"stream": self.stream, "_iterator": None, "_next": 0}

    def __getitem__(self, index: int) -> Example:
        if self._iterator is None or index < self._next:
            self._iterator, self._next = iter(self.stream), 0
        if index > self._next:
            next(itertools.islice(self._iterator, index - self._next - 1, None))  # skip
            self._next = index
        self._next += 1
        return next(self._iterator)


class ReshuffledPool:
    """A finite dataset as an endless sequence of passes, pass p shuffled by (seed, p)."""

    def __init__(self, dataset, seed: int) -> None:
        if len(dataset) == 0:
            raise ValueError("the training dataset is empty")
        self.dataset = dataset
        self.seed = seed
        self.finite_size = len(dataset)
        self._permutation: tuple[int, list[int]] | None = None

    def __getitem__(self, index: int) -> Example:
        p = index // self.finite_size
        if self._permutation is None or self._permutation[0] != p:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + p)
            self._permutation = (p, torch.randperm(self.finite_size, generator=generator).tolist())
        return self.dataset[self._permutation[1][index % self.finite_size]]


class OffsetView:
    """Examples `offset + i` of an indexed stream: a part of it the regular batches never reach."""

    finite_size = None

    def __init__(self, source: IndexedStream, offset: int) -> None:
        self.source = source
        self.offset = offset

    def __getitem__(self, index: int) -> Example:
        return self.source[self.offset + index]


TOPUP_OFFSET = 2**40  # where the top-up prompts of an endless indexed stream start


def example_source(dataset: Dataset | IterableDataset, seed: int):
    """A task's training data as an endless view read by global example index."""
    if isinstance(dataset, IterableDataset):
        return IndexedStream(dataset) if hasattr(dataset, "example_at") else SequentialStream(dataset)
    return ReshuffledPool(dataset, seed)


class PromptStream(IterableDataset):
    """One rank's training batches (collated) from `start` (a global example index): `num_batches`, or endless.

    It yields whole batches, so its loader has `batch_size=None`: per-example work stays in one loop here."""

    def __init__(
        self,
        source,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        start: int = 0,
        num_batches: int | None = None,
    ):
        self.source = source
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.start = start
        self.num_batches = num_batches

    def __len__(self) -> int:
        if self.num_batches is None:
            raise TypeError("an endless prompt stream has no length")
        return self.num_batches

    def __iter__(self):
        worker = get_worker_info()
        worker_id, num_workers = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        if num_workers > 1 and isinstance(self.source, SequentialStream):
            raise ValueError(
                "a training stream without `example_at(index)` cannot be read exactly by worker processes: "
                "set data.num_workers=0 or give the stream an example_at method"
            )
        batches = itertools.count(worker_id, num_workers)
        if self.num_batches is not None:
            batches = range(worker_id, self.num_batches, num_workers)
        for j in batches:
            first = self.start + (j * self.world_size + self.rank) * self.batch_size
            yield collate_examples([self.source[index] for index in range(first, first + self.batch_size)])


def as_is(batch):
    """The collate function of loaders whose dataset yields whole batches."""
    return batch


class ResumableLoader(DataLoader):
    """A `DataLoader` whose every iteration starts at the data module's current position.

    It has `state_dict`/`load_state_dict` so that Lightning treats it as resumable; the position
    itself is saved and restored by `RLVRDataModule.state_dict` / `load_state_dict`."""

    def __init__(self, dataset: PromptStream, position: Callable[[], int], **kwargs) -> None:
        super().__init__(dataset, **kwargs)
        self._position = position

    def __iter__(self):
        self.dataset.start = self._position()
        return super().__iter__()

    def state_dict(self) -> dict[str, int]:
        return {"position": self._position()}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        """Nothing to do: `RLVRDataModule.load_state_dict` restored the position before this loader existed."""

"""The sorting task: the prompt is `length` tokens drawn from `range(vocab_size)`, the answer
is the same tokens sorted (CS336 spring 2025, lecture 17).

Validation prompts are held out by construction: a prompt is a validation prompt when a hash
of its tokens is a multiple of `holdout_every`, and the training stream never yields one. (A
hash, not the prompt read as a number: "index % 10 == 0" would hold out exactly the prompts
ending in token 0, a validation set unlike anything trained on.)
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Annotated

import torch
from torch import Tensor
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from rlvr_lightning.data.task import Example, ListDataset, Task
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import NON_NEGATIVE_INT, POSITIVE_INT, Range


@documented_options
class SortTask(Task):
    def __init__(
        self,
        vocab_size: Annotated[int, Option("tokens are drawn from range(vocab_size).", Range(2, integer=True))] = 10,
        length: Annotated[int, Option("tokens per prompt.", POSITIVE_INT)] = 4,
        num_val: Annotated[int, Option("validation prompts.", NON_NEGATIVE_INT)] = 256,
        num_train: Annotated[
            int | None,
            Option(
                "null streams fresh prompts forever; an int fixes a training pool of that size.",
                Range(1, integer=True, optional=True),
            ),
        ] = None,
        holdout_every: Annotated[
            int,
            Option(
                "one prompt in this many (by hash) is held out for validation (1 would hold out all).",
                Range(2, integer=True),
            ),
        ] = 10,
        seed: int = 0,
    ) -> None:
        check_options(SortTask, locals())
        self.vocab_size = vocab_size
        self.length = length
        self.num_val = num_val
        self.num_train = num_train
        self.holdout_every = holdout_every
        self.seed = seed

    def is_held_out(self, prompt: list[int]) -> bool:
        return prompt_hash_of(prompt) % self.holdout_every == 0

    def example(self, prompt: list[int]) -> Example:
        return {"prompt": prompt, "answer": sorted(prompt)}

    def draw(self, rng: random.Random, held_out: bool) -> list[int]:
        while True:
            prompt = [rng.randrange(self.vocab_size) for _ in range(self.length)]
            if self.is_held_out(prompt) == held_out:
                return prompt

    def train_dataset(self) -> Dataset | IterableDataset:
        if self.num_train is None:
            return SortStream(self)
        rng = random.Random(self.seed)
        return ListDataset([self.example(self.draw(rng, held_out=False)) for _ in range(self.num_train)])

    def val_dataset(self) -> Dataset | None:
        if self.num_val == 0:
            return None
        rng = random.Random(f"{self.seed}-validation")
        return ListDataset([self.example(self.draw(rng, held_out=True)) for _ in range(self.num_val)])


def prompt_hash(prompts: Tensor) -> Tensor:
    """A well-mixed 16-bit hash of each row of `prompts` [B, L].

    A polynomial hash mod 2^31 - 1, then Knuth's multiplicative mix (no product leaves int64: h < 2^31)."""
    h = torch.zeros(prompts.shape[0], dtype=torch.int64)
    for column in prompts.long().unbind(dim=1):
        h = (h * 1_000_003 + column + 1) % 2_147_483_647
    return ((h * 2_654_435_761) % 2**32) >> 16


def prompt_hash_of(prompt: Sequence[int]) -> int:
    """`prompt_hash` of one prompt in Python integers: a hundred times faster than a one-row tensor, for the
    prompt-by-prompt draws of a fixed dataset."""
    h = 0
    for token in prompt:
        h = (h * 1_000_003 + token + 1) % 2_147_483_647
    return ((h * 2_654_435_761) % 2**32) >> 16


class SortStream(IterableDataset):
    """Endless seeded stream. Prompts are drawn in blocks of `BLOCK` from a generator seeded by
    (seed, block), so example `i` depends only on (seed, i) and a stream position is one integer
    (`start`, the state of the stream; `example_at(i)` reads any position directly)."""

    BLOCK = 4096

    def __init__(self, task: SortTask, start: int = 0) -> None:
        self.task = task
        self.start = start
        self._cached_block: tuple[int, list[list[int]]] | None = None

    def example_at(self, index: int) -> Example:
        """Example `index` of the stream (random access: `RLVRDataModule` resumes a run here at no cost)."""
        block_index = index // self.BLOCK
        if self._cached_block is None or self._cached_block[0] != block_index:
            self._cached_block = (block_index, self.block(block_index))
        return self.task.example(self._cached_block[1][index % self.BLOCK])

    def state_dict(self) -> dict[str, int]:
        return {"start": self.start}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.start = int(state["start"])

    def block(self, block_index: int) -> list[list[int]]:
        task = self.task
        generator = torch.Generator().manual_seed(task.seed * 1_000_003 + block_index)
        prompts: list[list[int]] = []
        while len(prompts) < self.BLOCK:
            candidates = torch.randint(task.vocab_size, (self.BLOCK, task.length), generator=generator)
            keep = prompt_hash(candidates) % task.holdout_every != 0
            prompts.extend(candidates[keep].tolist())
        return prompts[: self.BLOCK]

    def __iter__(self):
        worker = get_worker_info()
        index, stride = self.start, 1
        if worker is not None:
            index, stride = self.start + worker.id, worker.num_workers
        block_index, block = None, []
        while True:
            if index // self.BLOCK != block_index:
                block_index = index // self.BLOCK
                block = self.block(block_index)
            yield self.task.example(block[index % self.BLOCK])
            index += stride

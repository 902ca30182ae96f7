"""`InlineTask`: prompts written straight into the config, for demos, smoke tests and benchmarks.

    data:
      class_path: rlvr_lightning.data.RLVRDataModule
      init_args:
        batch_size: 2
        task:
          class_path: rlvr_lightning.data.inline_task.InlineTask
          init_args:
            examples:
              - {prompt: "What is 2+3?", answer: "5"}
              - {prompt: "What is 7-4?", answer: "3"}

Every example is a dict with a `"prompt"` (text, chat messages or token ids: whatever the policy
understands); its other keys travel to the rewards as metadata. By default the training set is an
endless stream that goes through the examples in a new seeded order on every pass (so a run is as
long as `trainer.limit_train_batches` says, however few the examples); `repeat: false` makes it
the finite list, shuffled by the data loader once per epoch.
"""

from __future__ import annotations

import random
from typing import Any

from torch.utils.data import Dataset, IterableDataset, get_worker_info

from rlvr_lightning.data.task import Example, ListDataset, Task

# An example's values as the config writes them. Not `Any` alone: jsonargparse parses a string typed `Any` again
# as YAML, so the prompt "Count: 1 2" would become the dict {"Count": "1 2"} and the answer "3" the number 3. Typed
# members first (strings stay strings down to lists of dicts of lists), `Any` last for anything deeper.
_Scalar = str | int | float | bool | None
_Leaf = _Scalar | list[_Scalar] | dict[str, _Scalar]
ExampleValue = _Scalar | list[_Leaf | dict[str, _Leaf]] | dict[str, _Leaf | list[_Leaf]] | Any


class InlineTask(Task):
    def __init__(
        self,
        examples: list[dict[str, ExampleValue]],
        val_examples: list[dict[str, ExampleValue]] | None = None,
        repeat: bool = True,
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        """
        Args:
            examples: training examples, each a dict with a "prompt" key.
            val_examples: validation examples (same form), or None for no validation.
            repeat: stream the examples forever (True) or give them as a finite dataset (False).
            shuffle: with `repeat`, visit the examples in a new seeded order on every pass.
        """
        self.examples = _checked(examples, "examples")
        if not self.examples:
            raise ValueError("InlineTask needs at least one example")
        self.val_examples = _checked(val_examples, "val_examples") if val_examples else None
        self.repeat = repeat
        self.shuffle = shuffle
        self.seed = seed

    def train_dataset(self) -> Dataset | IterableDataset:
        if self.repeat:
            return _Cycle(self.examples, self.shuffle, self.seed)
        return ListDataset(self.examples)

    def val_dataset(self) -> Dataset | None:
        return ListDataset(self.val_examples) if self.val_examples else None


def _checked(examples: list[dict[str, Any]] | None, option: str) -> list[Example]:
    checked: list[Example] = []
    for i, example in enumerate(examples or []):
        if not isinstance(example, dict) or "prompt" not in example:
            raise ValueError(f"InlineTask {option}[{i}] must be a dict with a 'prompt' key, got {example!r}")
        checked.append(dict(example))
    return checked


class _Cycle(IterableDataset):
    """Pass after pass over the examples; pass `k` is in the order of `Random((seed, k))`."""

    def __init__(self, examples: list[Example], shuffle: bool, seed: int) -> None:
        self.examples = examples
        self.shuffle = shuffle
        self.seed = seed

    def __iter__(self):
        worker = get_worker_info()
        offset, stride = (0, 1) if worker is None else (worker.id, worker.num_workers)
        position = 0
        epoch = 0
        while True:
            order = list(range(len(self.examples)))
            if self.shuffle:
                random.Random(f"{self.seed}-{epoch}").shuffle(order)
            for index in order:
                if position % stride == offset:
                    yield dict(self.examples[index])
                position += 1
            epoch += 1

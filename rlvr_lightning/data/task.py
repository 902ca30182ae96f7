"""A `Task` is where prompts come from: a training source and a held-out validation split.

An example is a dict with a `"prompt"` (whatever the policy understands) and any other
keys the rewards need (ground truth, test cases, ...), which travel as per-row metadata.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from torch.utils.data import Dataset, IterableDataset

Example = dict[str, Any]


class Task(ABC):
    @abstractmethod
    def train_dataset(self) -> Dataset | IterableDataset:
        """Training prompts: a finite dataset (shuffled each epoch) or an endless stream."""

    def val_dataset(self) -> Dataset | None:
        """Held-out prompts for validation, or None."""
        return None

    def example_location(self, split: str, index: int) -> str:
        """Where example ``index`` of ``split`` ("train" or "val") comes from, for error messages."""
        return f"{split} example {index}"

    def update_difficulty(self, candidates: list[Example], pass_counts: list[int], n: int) -> dict[str, float]:
        """After a curriculum refresh: the candidates and their passes out of `n`; a task with difficulty
        levels moves them here and returns the stats to log (every rank gets the same arguments)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The task's own state for checkpoints (difficulty levels); empty for most tasks."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        return None


class ListDataset(Dataset):
    """A list of examples as a map-style dataset."""

    def __init__(self, examples: list[Example]) -> None:
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> Example:
        return self.examples[index]


def collate_examples(examples: list[Example]) -> dict[str, list[Any]]:
    """`[{"prompt": p, **meta}, ...]` -> `{"prompt": [p, ...], "metadata": [meta, ...]}`."""
    return {
        "prompt": [example["prompt"] for example in examples],
        "metadata": [{k: v for k, v in example.items() if k != "prompt"} for example in examples],
    }

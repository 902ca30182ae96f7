"""A task on your own data in a file of its own: prompts and answers from a CSV file."""

import csv

from rlvr_lightning.data.task import ListDataset, Task


class CSVTask(Task):
    """Examples from a CSV file with a header row.

    The `prompt_column` of a row is its prompt; every other column travels to the rewards as the
    row's metadata (`rollout.metadata[i]["answer"]`, ...). The last `num_val` rows are held out
    for validation.
    """

    def __init__(self, path: str, prompt_column: str = "prompt", num_val: int = 0):
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        if not rows:
            raise ValueError(f"{path}: no rows under the header")
        if prompt_column not in rows[0]:
            raise ValueError(f"{path}: no column {prompt_column!r}; columns: {', '.join(rows[0])}")
        if not 0 <= num_val < len(rows):
            raise ValueError(f"num_val must be in [0, {len(rows)}) for {path}, got {num_val}")
        examples = [
            {"prompt": row[prompt_column], **{k: v for k, v in row.items() if k != prompt_column}} for row in rows
        ]
        self.path = path
        self.train = examples[: len(rows) - num_val]
        self.val = examples[len(rows) - num_val :]

    def train_dataset(self):
        return ListDataset(self.train)  # finite: shuffled every epoch (an IterableDataset streams instead)

    def val_dataset(self):
        return ListDataset(self.val) if self.val else None

    def example_location(self, split, index):
        # errors about an example (a prompt too long for the model, ...) name its line; line 1 is the header
        return f"{self.path}:{index + 2 + (len(self.train) if split == 'val' else 0)}"

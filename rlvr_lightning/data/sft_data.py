"""`SFTDataModule`: prompt/response pairs from JSONL files, for supervised fine-tuning
(cold starts, distillation from a stronger model) and for expert-iteration data.

One JSON object per line:

    {"prompt": [3, 1, 2, 0], "response": [0, 1, 2, 3]}                    token ids (toy policies)
    {"prompt": "What is 2+3?", "response": "5", "answer": "5"}             text (language models)
    {"prompt": [{"role": "user", "content": "..."}], "response": "..."}    chat messages

Every other key travels to the rewards as per-row metadata (as in a `Task`), so a validation
file with ground truth gives validation accuracy as well as the validation loss. Blank lines
are skipped; a malformed line is an error that names the file and the line.

Validation prompts come either from `val_file` (pairs: validation loss, plus accuracy when the
run has rewards) or from `val_task`, a `Task` whose held-out prompts are sampled and scored
(accuracy only), e.g. the same `SortTask` the RL stage validates on, so both stages report the
same number.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

import lightning.pytorch as pl
from torch.utils.data import DataLoader

from rlvr_lightning.data.task import ListDataset, Task, collate_examples
from rlvr_lightning.runtime.config_locations import check_input_file
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import NON_NEGATIVE_INT, POSITIVE_INT, InputFile, Range

Example = dict[str, Any]


def read_jsonl(path: str | os.PathLike, prompt_key: str = "prompt", response_key: str = "response") -> list[Example]:
    """Examples `{"prompt": ..., "response": ..., **metadata}` from a JSONL file, validated line by line."""
    path = check_input_file(path, "SFT data file")
    examples: list[Example] = []
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}, line {line_number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from None
            if not isinstance(record, dict):
                raise ValueError(
                    f"{where}: expected a JSON object with {prompt_key!r} and {response_key!r}, "
                    f"got {type(record).__name__}"
                )
            missing = [key for key in (prompt_key, response_key) if key not in record]
            if missing:
                raise ValueError(f"{where}: missing key(s) {missing}; the line has {sorted(record)}")
            prompt, response = record.pop(prompt_key), record.pop(response_key)
            _check_prompt(prompt, where, prompt_key)
            _check_response(response, where, response_key)
            examples.append({"prompt": prompt, "response": response, **record})
    if not examples:
        raise ValueError(f"SFT data file {str(path)!r} has no examples")
    return examples


def _is_token_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _check_prompt(prompt: Any, where: str, key: str) -> None:
    is_chat = isinstance(prompt, list) and bool(prompt) and all(isinstance(m, dict) and "content" in m for m in prompt)
    if not (isinstance(prompt, str) or _is_token_list(prompt) or is_chat):
        raise ValueError(
            f"{where}: {key!r} must be text, a list of token ids or a list of chat messages "
            f"({{'role': ..., 'content': ...}}), got {json.dumps(prompt)[:80]}"
        )
    if not prompt:
        raise ValueError(f"{where}: {key!r} is empty")


def _check_response(response: Any, where: str, key: str) -> None:
    if not (isinstance(response, str) or _is_token_list(response)):
        raise ValueError(f"{where}: {key!r} must be text or a list of token ids, got {json.dumps(response)[:80]}")
    if not response:
        raise ValueError(f"{where}: {key!r} is empty (there would be nothing to learn from)")


def write_jsonl(examples: Iterable[Example], path: str | os.PathLike) -> Path:
    """Write examples (dicts with "prompt" and "response") one per line; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for example in examples:
            handle.write(json.dumps(example) + "\n")
    return path


def collate_pairs(examples: list[Example]) -> dict[str, list[Any]]:
    """`[{"prompt", "response", **meta}]` -> `{"prompt": [...], "response": [...], "metadata": [...]}`."""
    return {
        "prompt": [example["prompt"] for example in examples],
        "response": [example["response"] for example in examples],
        "metadata": [{k: v for k, v in example.items() if k not in ("prompt", "response")} for example in examples],
    }


@documented_options
class SFTDataModule(pl.LightningDataModule):
    def __init__(
        self,
        train_file: Annotated[str, Option("JSONL of training pairs (shuffled every epoch).", InputFile())],
        val_file: Annotated[
            str | None,
            Option(
                "JSONL of validation pairs (validation loss; accuracy too when rewards are configured).",
                InputFile(True),
            ),
        ] = None,
        val_task: Task | None = None,
        batch_size: Annotated[int, Option("pairs per optimizer step.", POSITIVE_INT)] = 32,
        val_batch_size: Annotated[
            int | None, Option("rows per validation batch (null: batch_size).", Range(1, integer=True, optional=True))
        ] = None,
        num_workers: Annotated[
            int, Option("DataLoader worker processes (0: load in the main process).", NON_NEGATIVE_INT)
        ] = 0,
        prompt_key: str = "prompt",
        response_key: str = "response",
    ) -> None:
        """
        Args:
            val_task: a `Task` whose `val_dataset()` prompts are sampled and scored instead (accuracy only).
            prompt_key: the JSON key of the prompt.
            response_key: the JSON key of the response.
        """
        super().__init__()
        check_options(SFTDataModule, locals())
        if val_file is not None and val_task is not None:
            raise ValueError("give either val_file (pairs) or val_task (held-out prompts), not both")
        self.train_file = train_file
        self.val_file = val_file
        self.val_task = val_task
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size or batch_size
        self.num_workers = num_workers
        self.prompt_key = prompt_key
        self.response_key = response_key
        self.train_examples: list[Example] | None = None
        self.val_examples: list[Example] | None = None

    def setup(self, stage: str) -> None:
        if self.train_examples is None:
            self.train_examples = read_jsonl(self.train_file, self.prompt_key, self.response_key)
        if self.val_file is not None and self.val_examples is None:
            self.val_examples = read_jsonl(self.val_file, self.prompt_key, self.response_key)

    def train_dataloader(self) -> DataLoader:
        if self.train_examples is None:
            self.setup("fit")
        return DataLoader(
            ListDataset(self.train_examples),
            batch_size=self.batch_size,
            shuffle=True,
            collate_fn=collate_pairs,
            num_workers=self.num_workers,
        )

    def val_dataloader(self) -> DataLoader | list:
        if self.val_task is not None:
            dataset = self.val_task.val_dataset()
            if dataset is None:
                return []
            return DataLoader(
                dataset, batch_size=self.val_batch_size, collate_fn=collate_examples, num_workers=self.num_workers
            )
        if self.val_file is None:
            return []
        if self.val_examples is None:
            self.setup("validate")
        return DataLoader(
            ListDataset(self.val_examples),
            batch_size=self.val_batch_size,
            collate_fn=collate_pairs,
            num_workers=self.num_workers,
        )

    def predict_dataloader(self) -> DataLoader | list:
        """`rlvr predict` completes the validation prompts (their reference responses are ignored)."""
        return self.val_dataloader()

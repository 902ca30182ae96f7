"""`JSONLTask`: math problems from JSON-lines files in GSM8K or MATH format (or any two fields).

    task:
      class_path: rlvr_lightning.data.jsonl_task.JSONLTask
      init_args: {path: data/gsm8k_train.jsonl, val_path: data/gsm8k_test.jsonl, template: r1_zero}

Record formats (``format``):

* ``gsm8k``: ``{"question": ..., "answer": "... #### 72"}``; the ground truth is the number after
  the last ``####`` (commas removed);
* ``math``: ``{"problem": ..., "solution": "... \\boxed{\\frac{1}{2}}"}``; the ground truth is the
  record's ``answer`` field when present, else the last ``\\boxed{}`` of the solution;
* ``auto`` (default): ``gsm8k`` for records with ``question``/``answer``, ``math`` for records with
  ``problem``/``solution``, decided per record;
* ``fields``: ``question_key`` and ``answer_key`` name the fields; the answer is used as is.

An example is ``{"prompt": <templated question>, "answer": <ground truth>, "question": ...,
"solution": <the record's worked solution, if any>}``. A line that is not a JSON object, or a
record whose ground truth cannot be found, fails with an error naming the file and line number.
Blank lines are skipped.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from rlvr_lightning.data.sort_task import ListDataset
from rlvr_lightning.data.task import Example, Task
from rlvr_lightning.data.templates import apply_template, resolve_template
from rlvr_lightning.verifiers.answers import extract_boxed, extract_gsm8k

FORMATS = ("auto", "gsm8k", "math", "fields")


class RecordError(ValueError):
    """A record that cannot become an example (the message says why)."""


def record_to_example(
    record: Any,
    format: str = "auto",
    template: str = "chat_boxed",
    question_key: str | None = None,
    answer_key: str | None = None,
) -> Example:
    """One GSM8K / MATH / custom record as an example (raises `RecordError` saying what is wrong)."""
    if not isinstance(record, dict):
        raise RecordError(f"expected a JSON object, got {type(record).__name__}")
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    if format == "fields" or question_key is not None or answer_key is not None:
        q_key, a_key = question_key or "question", answer_key or "answer"
        question, answer, solution = _field(record, q_key), _field(record, a_key), None
        answer = str(answer).strip()
    else:
        if format == "auto":
            format = "gsm8k" if "question" in record else "math" if "problem" in record else ""
            if not format:
                raise RecordError(f"cannot tell the format: no 'question' (GSM8K) or 'problem' (MATH) field; keys {sorted(record)}")
        if format == "gsm8k":
            question, solution = _field(record, "question"), str(_field(record, "answer"))
            answer = extract_gsm8k(solution)
            if answer is None:
                raise RecordError("GSM8K record: no '#### <number>' in its 'answer' field")
        else:
            question = _field(record, "problem")
            solution = record.get("solution")
            answer = record.get("answer")
            if answer is None or not str(answer).strip():
                if solution is None:
                    raise RecordError("MATH record: neither an 'answer' nor a 'solution' field")
                answer = extract_boxed(str(solution))
                if not answer:
                    raise RecordError("MATH record: no \\boxed{...} answer in its 'solution' field")
            answer = str(answer).strip()
    question = str(question).strip()
    if not question:
        raise RecordError("empty question")
    example: Example = {"prompt": apply_template(template, question), "answer": answer, "question": question}
    if solution is not None:
        example["solution"] = str(solution)
    return example


def _field(record: dict, key: str) -> Any:
    if key not in record or record[key] is None:
        raise RecordError(f"missing field {key!r} (keys: {sorted(record)})")
    return record[key]


def read_jsonl(
    path: str | Path,
    format: str = "auto",
    template: str = "chat_boxed",
    question_key: str | None = None,
    answer_key: str | None = None,
    limit: int | None = None,
) -> list[Example]:
    """Examples of a JSONL file; a bad line raises ValueError naming ``file:line``."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"JSONL file {str(path)!r} does not exist ({path.resolve()})")
    examples: list[Example] = []
    with path.open(encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{line_number}: malformed JSON: {error.msg} (column {error.colno})") from None
            try:
                examples.append(record_to_example(record, format, template, question_key, answer_key))
            except RecordError as error:
                raise ValueError(f"{path}:{line_number}: {error}") from None
            if limit is not None and len(examples) >= limit:
                break
    if not examples:
        raise ValueError(f"{path}: no examples (the file is empty)")
    return examples


class JSONLTask(Task):
    def __init__(
        self,
        path: str,
        val_path: str | None = None,
        num_val: int | None = None,
        format: str = "auto",
        template: str = "chat_boxed",
        question_key: str | None = None,
        answer_key: str | None = None,
        limit: int | None = None,
        seed: int = 0,
    ) -> None:
        """
        Args:
            path: training JSONL file.
            val_path: validation JSONL file; None holds out `num_val` random training records instead.
            num_val: validation examples: with `val_path`, the first `num_val` of it (None: all);
                without, a seeded random `num_val` of the training file (None or 0: no validation).
            format: ``auto``, ``gsm8k``, ``math`` or ``fields`` (see the module docstring).
            template: how the question becomes the prompt (see `rlvr_lightning.data.templates`).
            question_key, answer_key: field names for ``format: fields``.
            limit: read at most this many training records.
        """
        if format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
        resolve_template(template)
        self.path = path
        self.val_path = val_path
        self.num_val = num_val
        self.format = format
        self.template = template
        self.question_key = question_key
        self.answer_key = answer_key
        self.limit = limit
        self.seed = seed
        self._split: tuple[list[Example], list[Example]] | None = None

    def _read(self, path: str, limit: int | None) -> list[Example]:
        return read_jsonl(path, self.format, self.template, self.question_key, self.answer_key, limit)

    def split(self) -> tuple[list[Example], list[Example]]:
        """(train, validation) examples, read once."""
        if self._split is None:
            train = self._read(self.path, self.limit)
            if self.val_path is not None:
                val = self._read(self.val_path, self.num_val)
            elif self.num_val:
                if self.num_val >= len(train):
                    raise ValueError(f"num_val={self.num_val} leaves no training examples of the {len(train)} in {self.path}")
                order = list(range(len(train)))
                random.Random(self.seed).shuffle(order)
                held = set(order[: self.num_val])
                val = [train[i] for i in sorted(held)]
                train = [e for i, e in enumerate(train) if i not in held]
            else:
                val = []
            self._split = (train, val)
        return self._split

    def train_dataset(self) -> Dataset:
        return ListDataset(self.split()[0])

    def val_dataset(self) -> Dataset | None:
        val = self.split()[1]
        return ListDataset(val) if val else None


__all__ = ["FORMATS", "JSONLTask", "RecordError", "read_jsonl", "record_to_example"]

"""`JSONLTask`: math problems from JSON-lines files in GSM8K or MATH format (or any two fields).

    task:
      class_path: rlvr_lightning.data.jsonl_task.JSONLTask
      init_args: {path: data/gsm8k_train.jsonl, val_path: data/gsm8k_test.jsonl, template: r1_zero}

Record formats (``format``):

* ``gsm8k``: ``{"question": ..., "answer": "... #### 72"}``; the ground truth is the whole number
  after the last ``####``: sign, decimals, fraction, exponent (``1/2``, ``-3.5``, ``1e3``), thousands
  separators removed (``1,234`` or ``1 234``); anything else on that line (``3,14``) is an error;
* ``math``: ``{"problem": ..., "solution": "... \\boxed{\\frac{1}{2}}"}``; the ground truth is the
  record's ``answer`` field when present, else the last ``\\boxed{}`` of the solution;
* ``auto`` (default): ``gsm8k`` for records with ``question``/``answer``, ``math`` for records with
  ``problem``/``solution``, decided per record;
* ``fields``: ``question_key`` and ``answer_key`` name the fields; the answer is used as is.

An example is ``{"prompt": <templated question>, "answer": <ground truth>, "question": ...,
"solution": <the record's worked solution, if any>}``. A line that is not UTF-8 (a byte-order mark
on the first line is fine), not a JSON object (or nested too deeply), longer than
``MAX_LINE_BYTES``, whose prompt is longer than ``max_prompt_chars``, that lacks a field (the message
lists the ones it has), whose question or solution is not a string (``{"question": 5}``) or answer neither
a string nor a number, or whose ground truth cannot be found fails with an error naming the file and line
number. Blank lines are skipped. Prompts
longer than the model's context are rejected when a run starts, also by file and line
(`rlvr_lightning.data.prompt_lengths`).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Annotated, Any

from torch.utils.data import Dataset

from rlvr_lightning.data.sort_task import ListDataset
from rlvr_lightning.data.task import Example, Task
from rlvr_lightning.data.templates import apply_template, resolve_template
from rlvr_lightning.grading.answers import extract_boxed, extract_gsm8k
from rlvr_lightning.runtime.config_locations import check_input_file
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import InputFile, Range

FORMATS = ("auto", "gsm8k", "math", "fields")
MAX_LINE_BYTES = 16 * 2**20  # a longer line is rejected before it is parsed
DEFAULT_MAX_PROMPT_CHARS = 100_000  # ~25k tokens: beyond the context of the models this runs


class RecordError(ValueError):
    """A record that cannot become an example (the message says why)."""


def record_to_example(
    record: Any,
    format: str = "auto",
    template: str = "chat_boxed",
    question_key: str | None = None,
    answer_key: str | None = None,
    max_prompt_chars: int | None = None,
) -> Example:
    """One GSM8K / MATH / custom record as an example (raises `RecordError` saying what is wrong)."""
    if not isinstance(record, dict):
        raise RecordError(f"expected a JSON object, got {type(record).__name__}")
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    if format == "fields" or question_key is not None or answer_key is not None:
        q_key, a_key = question_key or "question", answer_key or "answer"
        question, answer, solution = _text(record, q_key), _answer(record, a_key), None
    else:
        if format == "auto":
            format = "gsm8k" if "question" in record else "math" if "problem" in record else ""
            if not format:
                raise RecordError(
                    "cannot tell the format: no 'question' (GSM8K) or 'problem' (MATH) field (the record has "
                    f"{', '.join(sorted(record)) or 'no field'})"
                )
        if format == "gsm8k":
            question, solution = _text(record, "question"), _text(record, "answer")
            if "####" not in solution:
                raise RecordError("GSM8K record: no '#### <number>' in its 'answer' field")
            try:
                answer = extract_gsm8k(solution, strict=True)
            except ValueError as error:
                raise RecordError(f"GSM8K record: {error}") from None
        else:
            question = _text(record, "problem")
            solution = _text(record, "solution") if record.get("solution") is not None else None
            answer = _answer(record, "answer") if record.get("answer") is not None else ""
            if not answer:
                if solution is None:
                    raise RecordError("MATH record: neither an 'answer' nor a 'solution' field")
                answer = extract_boxed(solution)
                if not answer:
                    raise RecordError("MATH record: no \\boxed{...} answer in its 'solution' field")
            answer = str(answer).strip()
    question = question.strip()
    if not question:
        raise RecordError("empty question")
    prompt = apply_template(template, question)
    if max_prompt_chars is not None and len(prompt) > max_prompt_chars:
        raise RecordError(f"the prompt is {len(prompt):,} characters long, over max_prompt_chars={max_prompt_chars:,}")
    example: Example = {"prompt": prompt, "answer": answer, "question": question}
    if solution is not None:
        example["solution"] = str(solution)
    return example


def _field(record: dict, key: str) -> Any:
    if key not in record or record[key] is None:
        raise RecordError(f"missing field {key!r} (the record has {', '.join(sorted(record)) or 'no field'})")
    return record[key]


def _text(record: dict, key: str) -> str:
    """The field `key`, which must be a string (a number would silently become its digits)."""
    value = _field(record, key)
    if not isinstance(value, str):
        raise RecordError(f"field {key!r} is {_kind(value)}, not a string")
    return value


def _answer(record: dict, key: str) -> str:
    """The field `key` as a ground-truth answer: a string, or a number written as one (`42`, `0.5`)."""
    value = _field(record, key)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise RecordError(f"field {key!r} is {_kind(value)}, not a string or a number")
    return str(value).strip()


def _kind(value: Any) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", list: "a list", dict: "an object"}
    shown = json.dumps(value, default=str)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return f"{names.get(type(value), type(value).__name__)} ({shown})"


def read_jsonl(
    path: str | Path,
    format: str = "auto",
    template: str = "chat_boxed",
    question_key: str | None = None,
    answer_key: str | None = None,
    limit: int | None = None,
    max_prompt_chars: int | None = DEFAULT_MAX_PROMPT_CHARS,
    line_numbers: list[int] | None = None,
) -> list[Example]:
    """Examples of a JSONL file; a bad line raises ValueError naming ``file:line``.

    ``line_numbers``, if given, receives the line number of every example."""
    path = check_input_file(path, "JSONL file")
    examples: list[Example] = []
    for line_number, record in _records(path):
        try:
            examples.append(record_to_example(record, format, template, question_key, answer_key, max_prompt_chars))
        except RecordError as error:
            raise ValueError(f"{path}:{line_number}: {error}") from None
        if line_numbers is not None:
            line_numbers.append(line_number)
        if limit is not None and len(examples) >= limit:
            break
    if not examples:
        raise ValueError(f"{path}: no examples (the file is empty)")
    return examples


def _records(path: Path):
    """(line number, parsed JSON) of every non-blank line, each line checked before it is parsed."""
    with path.open("rb") as f:
        line_number = 0
        while True:
            raw = f.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            line_number += 1
            if len(raw) > MAX_LINE_BYTES:
                raise ValueError(f"{path}:{line_number}: line longer than {MAX_LINE_BYTES:,} bytes (MAX_LINE_BYTES)")
            try:
                line = raw.decode("utf-8-sig" if line_number == 1 else "utf-8")  # a byte-order mark may start the file
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"{path}:{line_number}: not UTF-8: byte 0x{raw[error.start]:02x} "
                    f"at byte {error.start + 1} of the line"
                ) from None
            if not line.strip():
                continue
            try:
                yield line_number, json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{line_number}: malformed JSON: {error.msg} (column {error.colno})") from None
            except RecursionError:
                raise ValueError(f"{path}:{line_number}: JSON nested too deeply to parse") from None


@documented_options
class JSONLTask(Task):
    def __init__(
        self,
        path: Annotated[str, Option("training JSONL file.", InputFile())],
        val_path: Annotated[
            str | None,
            Option("validation JSONL file; None holds out `num_val` random training records instead.", InputFile(True)),
        ] = None,
        num_val: Annotated[
            int | None,
            Option(
                "validation examples: with `val_path`, the first `num_val` of it (None: all); without, a "
                "seeded random `num_val` of the training file (None or 0: no validation).",
                Range(0, integer=True, optional=True),
            ),
        ] = None,
        format: str = "auto",
        template: str = "chat_boxed",
        question_key: str | None = None,
        answer_key: str | None = None,
        limit: Annotated[
            int | None, Option("read at most this many training records.", Range(1, integer=True, optional=True))
        ] = None,
        seed: int = 0,
        max_prompt_chars: Annotated[
            int | None,
            Option(
                "a longer prompt fails at load time, naming its file and line (None: no limit; prompts "
                "longer than the model's context fail when the run starts, see `prompt_lengths`).",
                Range(1, integer=True, optional=True),
            ),
        ] = DEFAULT_MAX_PROMPT_CHARS,
    ) -> None:
        """
        Args:
            format: ``auto``, ``gsm8k``, ``math`` or ``fields`` (see the module docstring).
            template: how the question becomes the prompt (see `rlvr_lightning.data.templates`).
            question_key: the question's field name for ``format: fields``.
            answer_key: the answer's field name for ``format: fields``.
        """
        check_options(JSONLTask, locals())  # the files too: `rlvr` checks them before the model loads
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
        self.max_prompt_chars = max_prompt_chars
        self._split: tuple[list[Example], list[Example]] | None = None
        self._locations: dict[str, list[str]] = {}  # split -> "file:line" of each example

    def _read(self, path: str, limit: int | None) -> tuple[list[Example], list[str]]:
        lines: list[int] = []
        examples = read_jsonl(
            path, self.format, self.template, self.question_key, self.answer_key, limit, self.max_prompt_chars, lines
        )
        return examples, [f"{path}:{line}" for line in lines]

    def split(self) -> tuple[list[Example], list[Example]]:
        """(train, validation) examples, read once."""
        if self._split is None:
            train, train_at = self._read(self.path, self.limit)
            if self.val_path is not None:
                val, val_at = self._read(self.val_path, self.num_val)
            elif self.num_val:
                if self.num_val >= len(train):
                    raise ValueError(
                        f"num_val={self.num_val} leaves no training examples of the {len(train)} in {self.path}"
                    )
                order = list(range(len(train)))
                random.Random(self.seed).shuffle(order)
                held = set(order[: self.num_val])
                val, val_at = [train[i] for i in sorted(held)], [train_at[i] for i in sorted(held)]
                train_at = [at for i, at in enumerate(train_at) if i not in held]
                train = [e for i, e in enumerate(train) if i not in held]
            else:
                val, val_at = [], []
            self._split = (train, val)
            self._locations = {"train": train_at, "val": val_at}
        return self._split

    def example_location(self, split: str, index: int) -> str:
        """``file:line`` of example ``index`` of ``split`` ("train" or "val")."""
        self.split()
        return self._locations[split][index]

    def train_dataset(self) -> Dataset:
        return ListDataset(self.split()[0])

    def val_dataset(self) -> Dataset | None:
        val = self.split()[1]
        return ListDataset(val) if val else None


__all__ = [
    "DEFAULT_MAX_PROMPT_CHARS",
    "FORMATS",
    "JSONLTask",
    "MAX_LINE_BYTES",
    "RecordError",
    "read_jsonl",
    "record_to_example",
]

"""`HFDatasetTask`: GSM8K / MATH-format problems from a Hugging Face `datasets` dataset id.

    task:
      class_path: rlvr_lightning.data.hf_datasets.HFDatasetTask
      init_args: {dataset: openai/gsm8k, config_name: main, split: train, val_split: test, template: r1_zero}

Records are mapped exactly as `JSONLTask` maps JSONL lines (`record_to_example`: GSM8K
``question``/``answer`` with ``#### n``, MATH ``problem``/``solution`` with a boxed answer, or
named fields). `datasets` is imported only when the data is first needed (never by
``--print_config``); it is an optional dependency (``pip install datasets``). Offline, it reads
its local cache (set ``HF_DATASETS_OFFLINE=1``).
"""

from __future__ import annotations

from typing import Annotated, Any

from torch.utils.data import Dataset

from rlvr_lightning.data.jsonl_task import FORMATS, RecordError, record_to_example
from rlvr_lightning.data.sort_task import ListDataset
from rlvr_lightning.data.task import Example, Task
from rlvr_lightning.data.templates import resolve_template
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import Range


def examples_from_dataset(
    dataset: Any,
    format: str = "auto",
    template: str = "chat_boxed",
    question_key: str | None = None,
    answer_key: str | None = None,
    limit: int | None = None,
    source: str = "dataset",
) -> list[Example]:
    """Examples of an iterable of records (a `datasets.Dataset`); a bad record raises ValueError naming its index."""
    examples: list[Example] = []
    for index, record in enumerate(dataset):
        if limit is not None and index >= limit:
            break
        try:
            examples.append(record_to_example(dict(record), format, template, question_key, answer_key))
        except RecordError as error:
            raise ValueError(f"{source}[{index}]: {error}") from None
    if not examples:
        raise ValueError(f"{source}: no examples")
    return examples


def _import_datasets():
    try:
        import datasets
    except ImportError as error:
        raise ImportError("HFDatasetTask needs the `datasets` package: pip install datasets") from error
    return datasets


@documented_options
class HFDatasetTask(Task):
    def __init__(
        self,
        dataset: str,
        config_name: str | None = None,
        split: str = "train",
        val_split: str | None = "test",
        num_val: Annotated[
            int | None, Option("at most this many validation records.", Range(0, integer=True, optional=True))
        ] = None,
        limit: Annotated[
            int | None, Option("at most this many training records.", Range(1, integer=True, optional=True))
        ] = None,
        format: str = "auto",
        template: str = "chat_boxed",
        question_key: str | None = None,
        answer_key: str | None = None,
        revision: str | None = None,
        data_files: Any = None,
    ) -> None:
        """
        Args:
            dataset: a dataset id (``openai/gsm8k``) or a local path `datasets.load_dataset` understands.
            config_name: the dataset's configuration (``main`` for GSM8K).
            split: the training split.
            val_split: the validation split (None: no validation).
            format: as in `JSONLTask`.
            template: as in `JSONLTask`.
            question_key: as in `JSONLTask`.
            answer_key: as in `JSONLTask`.
            revision: passed to `datasets.load_dataset`.
            data_files: passed to `datasets.load_dataset`.
        """
        check_options(HFDatasetTask, locals())
        if format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
        resolve_template(template)
        self.dataset = dataset
        self.config_name = config_name
        self.split = split
        self.val_split = val_split
        self.num_val = num_val
        self.limit = limit
        self.format = format
        self.template = template
        self.question_key = question_key
        self.answer_key = answer_key
        self.revision = revision
        self.data_files = data_files
        self._cache: dict[str, list[Example]] = {}

    def load_split(self, split: str, limit: int | None) -> list[Example]:
        if split not in self._cache:
            datasets = _import_datasets()
            data = datasets.load_dataset(
                self.dataset, self.config_name, split=split, revision=self.revision, data_files=self.data_files
            )
            self._cache[split] = self.to_examples(data, split, limit)
        return self._cache[split]

    def to_examples(self, data: Any, split: str = "train", limit: int | None = None) -> list[Example]:
        """Examples of an already loaded split (a `datasets.Dataset` or any iterable of dicts)."""
        source = f"{self.dataset}:{split}"
        return examples_from_dataset(
            data, self.format, self.template, self.question_key, self.answer_key, limit, source
        )

    def train_dataset(self) -> Dataset:
        return ListDataset(self.load_split(self.split, self.limit))

    def val_dataset(self) -> Dataset | None:
        if self.val_split is None or self.num_val == 0:
            return None
        return ListDataset(self.load_split(self.val_split, self.num_val))

    def example_location(self, split: str, index: int) -> str:
        """``dataset:split[index]``, as the record errors name it."""
        return f"{self.dataset}:{self.split if split == 'train' else self.val_split}[{index}]"


__all__ = ["HFDatasetTask", "examples_from_dataset"]

"""`ReasoningGymTask`: prompts drawn from one or several reasoning-gym datasets, at curriculum levels.

    task:
      class_path: rlvr_lightning.data.reasoning_gym_task.ReasoningGymTask
      init_args:
        template: chat_boxed
        datasets:
          - {name: basic_arithmetic, weight: 2, levels: {num_terms: 0, num_digits: 0}}
          - {name: spell_backward, weight: 1, config: {min_word_len: 3}}
        curriculum: {raise_at: 0.7, lower_at: 0.1}

Each dataset is a reasoning-gym procedural dataset (Open-Thought/reasoning-gym, `reasoning_gym.create_dataset`)
built from its config at its current difficulty levels: a dataset with a reasoning-gym curriculum class
(`reasoning_gym.factory.create_curriculum`) has attributes with ordered levels (``num_terms``: 2, 3, 4, ...),
and `BaseCurriculum.generate_configuration` turns the levels into the dataset's config.

Training example `i` depends only on `(seed, i)` and the levels: a seeded draw picks the dataset (by
`weight`) and an entry index (below `size`), and the entry is the dataset's own ``ds[index]``. The
validation split is `num_val` entries per dataset from another seed at the initial levels (fixed, so
accuracy before and after training compares the same prompts); the training stream skips any entry
whose question is a validation question.

An example is ``{"prompt": <templated question>, "answer": <reference answer>, "rg_dataset": name,
"rg_entry": <the reasoning-gym entry>, "rg_config": <the dataset's config as a dict>, "rg_level": <its level>}``;
`ReasoningGymReward` scores with the dataset's own ``score_answer``.

Difficulty moves with the best-of-n curriculum (`DifficultyFilter`): after each refresh `RLVRDataModule`
hands the candidates and their pass counts to `update_difficulty` (`reasoning_gym_curriculum.py`).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from torch.utils.data import Dataset, IterableDataset

from rlvr_lightning.data.reasoning_gym_curriculum import CurriculumRule, DatasetLevels
from rlvr_lightning.data.task import Example, ListDataset, Task
from rlvr_lightning.data.templates import apply_template, resolve_template
from rlvr_lightning.runtime.optional_dependencies import require

SPEC_KEYS = ("name", "weight", "size", "seed", "config", "levels")
MAX_DRAWS = 1000


def _reasoning_gym():
    return require("reasoning_gym", "ReasoningGymTask")


@dataclasses.dataclass
class DatasetSpec:
    """One reasoning-gym dataset of the mix."""

    name: str
    weight: float = 1.0
    size: int = 100_000  # entry indices drawn below this (a finite problem space per level)
    seed: int | None = None  # default: the task's seed + the dataset's position
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    levels: dict[str, int] | int | None = None  # initial levels: per attribute, or one for all

    @classmethod
    def parse(cls, spec: dict[str, Any] | str, position: int) -> DatasetSpec:
        if isinstance(spec, str):
            spec = {"name": spec}
        unknown = sorted(set(spec) - set(SPEC_KEYS))
        if unknown or "name" not in spec:
            raise ValueError(
                f"datasets[{position}]={spec!r}: "
                + (f"unknown keys {unknown}" if unknown else "no 'name'")
                + f"; valid keys: {list(SPEC_KEYS)}"
            )
        parsed = cls(**spec)
        if not parsed.weight > 0:
            raise ValueError(f"datasets[{position}] ({parsed.name}): weight must be > 0, got {parsed.weight}")
        if parsed.size < 1:
            raise ValueError(f"datasets[{position}] ({parsed.name}): size must be >= 1, got {parsed.size}")
        return parsed


class ReasoningGymTask(Task):
    def __init__(
        self,
        datasets: list[dict[str, Any] | str],
        template: str = "chat_boxed",
        num_val: int = 50,
        seed: int = 0,
        curriculum: dict[str, Any] | None = None,
        range_mode: str = "inclusive",
    ) -> None:
        """
        Args:
            datasets: the mix: reasoning-gym dataset names, or dicts with `name`, `weight` (sampling weight,
                default 1), `size` (entry indices per level, default 100000), `seed`, `config` (the dataset's
                config fields) and `levels` (initial curriculum levels: an int for all attributes, or per attribute).
            template: how a question becomes the prompt (see `rlvr_lightning.data.templates`).
            num_val: held-out validation entries per dataset (at the initial levels); 0 for none.
            curriculum: how pass rates move the levels (`CurriculumRule`: `raise_at`, `lower_at`, `min_samples`).
            range_mode: how a level becomes a range of values (reasoning-gym's `RangeAttributeMode`):
                "inclusive" (levels 0..current), "upper_bound" (the current level's), "last_k".
        """
        _reasoning_gym()
        if not datasets:
            raise ValueError("ReasoningGymTask needs at least one dataset in `datasets`")
        if num_val < 0:
            raise ValueError(f"num_val must be >= 0, got {num_val}")
        resolve_template(template)
        self.specs = [DatasetSpec.parse(spec, k) for k, spec in enumerate(datasets)]
        names = [spec.name for spec in self.specs]
        if len(set(names)) != len(names):
            raise ValueError(f"datasets: each name once, got {names}")
        from reasoning_gym.factory import DATASETS

        for name in names:
            if name not in DATASETS:
                raise ValueError(f"datasets: {name!r} is not a reasoning-gym dataset; choose from {sorted(DATASETS)}")
        self.template = template
        self.num_val = num_val
        self.seed = seed
        self.rule = CurriculumRule(**(curriculum or {}))
        self.levels = {spec.name: DatasetLevels(spec.name, spec.levels, range_mode, spec.config) for spec in self.specs}
        self._weights = [spec.weight for spec in self.specs]
        self._datasets: dict[tuple, Any] = {}
        self._val: list[Example] | None = None
        self._val_questions: set[tuple[str, str]] | None = None

    @property
    def dataset_names(self) -> list[str]:
        return [spec.name for spec in self.specs]

    def _seed_of(self, position: int) -> int:
        spec = self.specs[position]
        return spec.seed if spec.seed is not None else self.seed * 1_000 + position

    def _dataset(self, position: int, config: dict[str, Any], seed: int):
        """The reasoning-gym dataset of `config` (cached by its config)."""
        key = (position, seed, repr(sorted(config.items())))
        if key not in self._datasets:
            from reasoning_gym.factory import DATASETS

            dataset_cls, config_cls = DATASETS[self.specs[position].name]
            cfg = config_cls(**{**config, "seed": seed, "size": self.specs[position].size})
            if hasattr(cfg, "validate"):
                cfg.validate()
            self._datasets[key] = dataset_cls(config=cfg)
        return self._datasets[key]

    def _example(self, position: int, config: dict[str, Any], seed: int, index: int, level: int = 0) -> Example:
        name = self.specs[position].name
        entry = self._dataset(position, config, seed)[index]
        return {
            "prompt": apply_template(self.template, entry["question"]),
            "answer": str(entry["answer"]),
            "question": entry["question"],
            "rg_dataset": name,
            "rg_entry": {"question": entry["question"], "answer": entry["answer"], "metadata": entry["metadata"]},
            "rg_config": dict(config),
            "rg_level": level,
        }

    # ------------------------------------------------------------------ examples

    def train_example(self, index: int) -> Example:
        """Training example `index`: a function of (seed, index, the current levels)."""
        rng = random.Random(f"{self.seed}-rg-train-{index}")
        position = rng.choices(range(len(self.specs)), weights=self._weights)[0]
        spec = self.specs[position]
        config, level = self.levels[spec.name].config(), self.levels[spec.name].level()
        held_out = self.val_questions()
        for _ in range(MAX_DRAWS):
            example = self._example(position, config, self._seed_of(position), rng.randrange(spec.size), level)
            if (spec.name, example["question"]) not in held_out:
                return example
        raise RuntimeError(
            f"ReasoningGymTask: {spec.name} drew only validation questions in {MAX_DRAWS} draws; lower num_val"
        )

    def val_examples(self) -> list[Example]:
        if self._val is None:
            examples = []
            for position, spec in enumerate(self.specs):
                levels = DatasetLevels(spec.name, spec.levels, self.levels[spec.name].range_mode, spec.config)
                seed = self._seed_of(position) + 2**31  # another seed: another sequence of entries
                rng = random.Random(f"{self.seed}-rg-val-{spec.name}")
                seen: set[str] = set()
                for _ in range(self.num_val * 20):
                    if len(seen) == self.num_val:
                        break
                    example = self._example(position, levels.config(), seed, rng.randrange(spec.size), levels.level())
                    if example["question"] not in seen:
                        seen.add(example["question"])
                        examples.append(example)
            self._val = examples
            self._val_questions = {(e["rg_dataset"], e["question"]) for e in examples}
        return self._val

    def val_questions(self) -> set[tuple[str, str]]:
        if self._val_questions is None:
            self.val_examples()
        return self._val_questions

    def train_dataset(self) -> Dataset | IterableDataset:
        return ReasoningGymStream(self)

    def val_dataset(self) -> Dataset | None:
        return ListDataset(self.val_examples()) if self.num_val else None

    def example_location(self, split: str, index: int) -> str:
        return f"reasoning-gym {split} example {index}"

    # ------------------------------------------------------------------ curriculum

    def update_difficulty(self, candidates: list[Example], pass_counts: list[int], n: int) -> dict[str, float]:
        """Move each dataset's levels by its candidates' pass rate (`CurriculumRule`); the stats to log."""
        return self.rule.apply(self.levels, candidates, pass_counts, n)

    def state_dict(self) -> dict[str, Any]:
        return {"levels": {name: levels.state_dict() for name, levels in self.levels.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, levels in state.get("levels", {}).items():
            if name in self.levels:
                self.levels[name].load_state_dict(levels)


class ReasoningGymStream(IterableDataset):
    """The endless training stream, read by index (`example_at`) by `RLVRDataModule`."""

    def __init__(self, task: ReasoningGymTask) -> None:
        self.task = task

    def example_at(self, index: int) -> Example:
        return self.task.train_example(index)

    def __iter__(self):
        index = 0
        while True:
            yield self.task.train_example(index)
            index += 1


__all__ = ["DatasetSpec", "ReasoningGymStream", "ReasoningGymTask"]

"""Difficulty levels of reasoning-gym datasets, moved by measured pass rates.

`DatasetLevels` holds one dataset's reasoning-gym curriculum (`reasoning_gym.coaching.BaseCurriculum`:
attributes with ordered levels, `generate_configuration` to a dataset config) and its current levels.
`CurriculumRule` moves them after a best-of-n refresh (`DifficultyFilter`): per dataset, the pass rate
over its candidates (passes / (candidates x n)) at or above `raise_at` raises every attribute one level
(reasoning-gym's `increment_global_level`), at or below `lower_at` lowers the highest ones
(`decrement_global_level`); fewer than `min_samples` candidates leave the levels as they are.

The moves are reasoning-gym's own (`reasoning_gym.coaching.CurriculumExperiment.update_difficulty(dataset,
"increment" | "decrement")` calls the same two `BaseCurriculum` methods); reasoning-gym leaves when to call
them to the trainer. Here the decision is a threshold on the pass rate that the best-of-n refresh measures with
the current policy, the estimate Kimi k1.5 (Kimi Team 2025, "sampling strategies": curriculum sampling, and
prioritized sampling by success rate) and Qwen3 (Yang et al. 2025, the reasoning-RL stage: queries kept by the
pass rate of sampled responses) select training prompts with.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rlvr_lightning.runtime.optional_dependencies import require

RANGE_MODES = ("inclusive", "upper_bound", "last_k")


class DatasetLevels:
    """One reasoning-gym dataset's curriculum levels and the config they make."""

    def __init__(
        self, name: str, levels: dict[str, int] | int | None, range_mode: str, base_config: dict[str, Any]
    ) -> None:
        require("reasoning_gym", "ReasoningGymTask")
        from reasoning_gym.coaching.base_curriculum import DefaultCurriculumContext, RangeAttributeMode
        from reasoning_gym.factory import create_curriculum, has_curriculum

        if range_mode not in RANGE_MODES:
            raise ValueError(f"range_mode={range_mode!r} is not valid; choose one of {list(RANGE_MODES)}")
        self.name = name
        self.range_mode = range_mode
        self.base_config = dict(base_config)
        self.curriculum = create_curriculum(name) if has_curriculum(name) else None
        self._context = DefaultCurriculumContext(mode=RangeAttributeMode(range_mode))
        if levels is None:
            return
        if self.curriculum is None:
            raise ValueError(f"datasets: {name} has no reasoning-gym curriculum, so no `levels`")
        attributes = self.curriculum.attributes
        if isinstance(levels, int):
            levels = {attr: min(levels, len(definition.levels) - 1) for attr, definition in attributes.items()}
        for attr, level in levels.items():
            if attr not in attributes:
                raise ValueError(
                    f"datasets: {name} has no curriculum attribute {attr!r}; choose from {sorted(attributes)}"
                )
            if not 0 <= level < len(attributes[attr].levels):
                raise ValueError(
                    f"datasets: {name}.{attr} level {level} is out of range 0..{len(attributes[attr].levels) - 1}"
                )
            self.curriculum.set_attr_level(attr, level)

    @property
    def has_curriculum(self) -> bool:
        return self.curriculum is not None

    def config(self) -> dict[str, Any]:
        """The dataset's config fields at the current levels (without `seed` and `size`)."""
        if self.curriculum is None:
            return dict(self.base_config)
        config = self.curriculum.generate_configuration(defaults=self.base_config, context=self._context)
        fields = dataclasses.asdict(config)
        fields.pop("seed", None)
        fields.pop("size", None)
        return fields

    def level(self) -> int:
        """The highest attribute level (reasoning-gym's `get_max_level`); 0 without a curriculum."""
        return self.curriculum.get_max_level() if self.curriculum is not None else 0

    def raise_level(self) -> bool:
        return self.curriculum is not None and self.curriculum.increment_global_level()

    def lower_level(self) -> bool:
        return self.curriculum is not None and self.curriculum.decrement_global_level()

    def state_dict(self) -> dict[str, int]:
        if self.curriculum is None:
            return {}
        return {attr: self.curriculum.get_attr_level(attr) for attr in self.curriculum.attributes}

    def load_state_dict(self, state: dict[str, int]) -> None:
        for attr, level in state.items():
            self.curriculum.set_attr_level(attr, int(level))


@dataclasses.dataclass
class CurriculumRule:
    """Raise a dataset's levels when its pass rate reaches `raise_at`, lower them at or below `lower_at`."""

    raise_at: float = 0.7
    lower_at: float = 0.1
    min_samples: int = 8  # candidates of a dataset needed to move it

    def __post_init__(self) -> None:
        if not 0.0 <= self.lower_at < self.raise_at <= 1.0:
            raise ValueError(
                "curriculum needs 0 <= lower_at < raise_at <= 1, "
                f"got lower_at={self.lower_at}, raise_at={self.raise_at}"
            )
        if self.min_samples < 1:
            raise ValueError(f"curriculum.min_samples must be >= 1, got {self.min_samples}")

    def apply(
        self, levels: dict[str, DatasetLevels], candidates: list[dict], pass_counts: list[int], n: int
    ) -> dict[str, float]:
        """Move the levels by the candidates' pass rates; per dataset: pass rate, candidates, move, new level."""
        passes = {name: 0 for name in levels}
        counts = {name: 0 for name in levels}
        for example, passed in zip(candidates, pass_counts, strict=True):
            name = example.get("rg_dataset")
            if name in counts:
                counts[name] += 1
                passes[name] += int(passed)
        stats: dict[str, float] = {}
        for name, dataset in levels.items():
            rate = passes[name] / (counts[name] * n) if counts[name] else 0.0
            move = 0
            if counts[name] >= self.min_samples:
                if rate >= self.raise_at and dataset.raise_level():
                    move = 1
                elif rate <= self.lower_at and dataset.lower_level():
                    move = -1
            stats[f"curriculum/{name}/pass_rate"] = rate
            stats[f"curriculum/{name}/candidates"] = float(counts[name])
            stats[f"curriculum/{name}/move"] = float(move)
            stats[f"curriculum/{name}/level"] = float(dataset.level())
        return stats


__all__ = ["RANGE_MODES", "CurriculumRule", "DatasetLevels"]

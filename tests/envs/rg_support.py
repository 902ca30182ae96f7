"""What the reasoning-gym tests share: the skip when the `envs` extra is missing, and a small task."""

from __future__ import annotations

import pytest

pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed: pip install 'rlvr-lightning[envs]'")

from rlvr_lightning.data.reasoning_gym_task import ReasoningGymTask  # noqa: E402

#: the datasets the shipped configs use, with the configs they use them with
USED_DATASETS = [
    {
        "name": "basic_arithmetic",
        "levels": 0,
        "config": {"operators": ["+", "-"], "allow_parentheses": False, "allow_negation": False},
    },
    {"name": "leg_counting", "levels": 0},
    {"name": "letter_counting", "levels": 0},
    {"name": "spell_backward", "levels": 0},
]


def small_task(**kwargs) -> ReasoningGymTask:
    options = {"datasets": USED_DATASETS[:3], "num_val": 10, "seed": 3}
    options.update(kwargs)
    return ReasoningGymTask(**options)


def row_metadata(example: dict) -> dict:
    """An example's metadata as a rollout row carries it (everything but the prompt)."""
    return {key: value for key, value in example.items() if key != "prompt"}

"""Measured pass rates move a reasoning-gym dataset's difficulty levels: up at `raise_at`, down at `lower_at`,
per dataset, logged; the levels are in the checkpoint and shape the prompts drawn after the move."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr_lightning.data.reasoning_gym_curriculum import CurriculumRule
from tests.envs.rg_support import USED_DATASETS, small_task
from tests.script_modules import load_script

ROOT = Path(__file__).resolve().parents[2]


def scripted_counts(candidates, rates: dict[str, float], n: int) -> list[int]:
    """Pass counts (out of n) giving each dataset exactly its pass rate over its candidates."""
    counts = []
    for example in candidates:
        counts.append(round(rates[example["rg_dataset"]] * n))  # every candidate of a dataset: rate * n passes
    return counts


def test_levels_follow_a_scripted_pass_rate_sequence_up_and_down():
    task = small_task(curriculum={"raise_at": 0.75, "lower_at": 0.25, "min_samples": 4})
    n = 4
    sequence = [  # (basic_arithmetic, leg_counting) pass rates of one refresh -> levels after it
        ((1.0, 0.5), (1, 0)),
        ((0.75, 0.0), (2, 0)),  # 0.0 at level 0: nowhere lower to go
        ((0.5, 1.0), (2, 1)),
        ((0.25, 0.75), (1, 2)),
        ((0.0, 0.25), (0, 1)),
    ]
    for step, ((arithmetic, legs), (want_arithmetic, want_legs)) in enumerate(sequence):
        candidates = [task.train_example(1000 * step + i) for i in range(40)]
        rates = {"basic_arithmetic": arithmetic, "leg_counting": legs, "letter_counting": 0.5}
        stats = task.update_difficulty(candidates, scripted_counts(candidates, rates, n), n)
        assert stats["curriculum/basic_arithmetic/level"] == want_arithmetic
        assert stats["curriculum/leg_counting/level"] == want_legs
        assert stats["curriculum/basic_arithmetic/pass_rate"] == pytest.approx(arithmetic)
        assert stats["curriculum/letter_counting/move"] == 0.0
    assert task.levels["leg_counting"].state_dict() == {"num_animals": 1, "num_instances": 1}


def test_a_raised_level_changes_the_prompts_drawn_after_it():
    task = small_task()
    before = {e["rg_config"]["max_terms"] for e in map(task.train_example, range(200)) if "max_terms" in e["rg_config"]}
    for _ in range(2):
        task.levels["basic_arithmetic"].raise_level()
    after = [e for e in map(task.train_example, range(200)) if e["rg_dataset"] == "basic_arithmetic"]
    assert before == {2} and {e["rg_config"]["max_terms"] for e in after} == {4}
    assert {e["rg_level"] for e in after} == {2}
    terms = {e["question"].count("+") + e["question"].count("-") + 1 for e in after}
    assert terms <= {2, 3, 4} and max(terms) == 4, "inclusive ranges: levels 0..2 -> 2 to 4 terms"


def test_too_few_candidates_leave_a_dataset_where_it_is():
    rule = CurriculumRule(raise_at=0.5, lower_at=0.1, min_samples=8)
    task = small_task()
    candidates = [e for e in map(task.train_example, range(60)) if e["rg_dataset"] == "leg_counting"][:7]
    stats = rule.apply(task.levels, candidates, [4] * 7, 4)
    assert stats["curriculum/leg_counting/move"] == 0.0 and stats["curriculum/leg_counting/candidates"] == 7.0


def test_difficulty_rises_through_the_data_modules_refresh_as_a_scripted_learner_improves():
    """The real refresh path: candidates at the current levels, sampled, scored by the datasets' own scorers,
    pass counts to the task; a learner whose skill grows by one level every two refreshes is followed."""
    history = load_script("reasoning_gym_curriculum_demo").run_demo(refreshes=6, skill_per_refresh=0.5, candidates=16)
    for name in ("basic_arithmetic", "leg_counting"):
        levels = [row[f"curriculum/{name}/level"] for row in history]
        assert levels == sorted(levels) and levels[-1] >= 2, f"{name} rose: {levels}"
        assert all(row[f"curriculum/{name}/candidates"] > 0 for row in history)
    assert history[0]["curriculum/reward_errors/reasoning_gym"] == 0.0


def test_used_datasets_have_curricula():
    task = small_task(datasets=USED_DATASETS)
    assert all(task.levels[spec["name"]].has_curriculum for spec in USED_DATASETS)

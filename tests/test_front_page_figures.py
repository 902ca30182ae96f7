"""The sort task's figures on the front pages (the README's sentence on the default job, the first table of
docs/benchmarks.md) are the ones its learning-suite record holds (docs/figures/<config>.json, rewritten by
`python scripts/learning_suite.py --only sort_grpo sort_lecture --seeds 0 1 2`): a rerun that moves them must move
the prose too."""

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def record(name: str) -> dict[str, tuple[float, float, list[float]]]:
    metrics = json.loads((REPO / "docs" / "figures" / f"{name}.json").read_text())["metrics"]
    return {k: (m["mean"], m["std"], [m["values"][s] for s in sorted(m["values"])]) for k, m in metrics.items()}


def reward_text(mean: float, std: float, values: list[float]) -> str:
    return f"{mean:.2f} ± {std:.2f} (" + ", ".join(f"{v:.2f}" for v in values)


def accuracy_text(mean: float, std: float, values: list[float]) -> str:
    return f"{100 * mean:.1f}% ± {100 * std:.1f}% (" + ", ".join(f"{100 * v:.1f}" for v in values)


def test_the_readme_states_the_default_jobs_recorded_figures():
    figures = record("sort_grpo")
    (reward, reward_std, _), (accuracy, accuracy_std, _) = figures["final_train_reward"], figures["val_exact_sort"]
    sentence = (
        f"train reward of {reward:.2f} ± {reward_std:.2f} and sorts {100 * accuracy:.1f}% ± {100 * accuracy_std:.1f}%"
    )
    assert sentence in " ".join((REPO / "README.md").read_text().split())


@pytest.mark.parametrize("name", ["sort_grpo", "sort_lecture"])
def test_the_benchmarks_table_row_states_the_recorded_figures(name):
    rows = [
        line
        for line in (REPO / "docs" / "benchmarks.md").read_text().splitlines()
        if line.startswith(f"| `{name}.yaml` |")
    ]
    assert len(rows) == 1, rows
    figures = record(name)
    assert reward_text(*figures["final_train_reward"]) in rows[0]
    assert accuracy_text(*figures["val_exact_sort"]) in rows[0]

"""A figure's curves over its seeds: mean and ± 1 std band (each seed a thin line), against rollout steps and
against minutes of training steps, for `scripts/learning_suite.py --plot`.

Minutes are the running sum of the CSV log's `time/step_s` up to each row (validation and checkpoint writes
are not in it), so a curve's x-axis is training time however the machine was shared. Against steps the
mean is taken at the steps every seed logged; against minutes each seed is interpolated onto a common grid
that ends where the shortest seed ends.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

MINUTES_GRID = 200


def series(path: Path, column: str) -> tuple[list[float], list[float], list[float]]:
    """(rollout step, minutes of training steps, value) of every row of `column` in a Lightning CSV log
    (steps count completed rollout steps: Lightning's 0-based `step` + 1)."""
    steps, minutes, values = [], [], []
    elapsed = 0.0
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row.get("time/step_s"):
                elapsed += float(row["time/step_s"])
            if row.get(column) not in (None, "") and not math.isnan(float(row[column])):
                steps.append(int(float(row["step"])) + 1)
                minutes.append(elapsed / 60)
                values.append(float(row[column]))
    return steps, minutes, values


def over_steps(curves: list[tuple[list[float], list[float]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps every seed logged, mean, sample std) of per-seed (steps, values)."""
    common = sorted(set.intersection(*(set(steps) for steps, _ in curves)))
    table = np.array([[dict(zip(steps, values, strict=True))[step] for step in common] for steps, values in curves])
    return np.array(common), table.mean(0), table.std(0, ddof=1) if len(curves) > 1 else np.zeros(len(common))


def over_minutes(curves: list[tuple[list[float], list[float]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(minutes grid, mean, sample std) of per-seed (minutes, values), each interpolated onto the grid."""
    end = min(max(minutes) for minutes, _ in curves)
    start = max(min(minutes) for minutes, _ in curves)
    grid = np.linspace(start, end, MINUTES_GRID) if end > start else np.array([end])
    table = np.array([np.interp(grid, minutes, values) for minutes, values in curves])
    return grid, table.mean(0), table.std(0, ddof=1) if len(curves) > 1 else np.zeros(len(grid))


def plot_figure(figure, runs, path: Path) -> None:
    """Both panels for every curve of `figure` over the seeds in `runs` that logged it; nothing when none did."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure_, (by_step, by_minute) = plt.subplots(1, 2, figsize=(12, 4.5))
    drawn = False
    for index, curve in enumerate(figure.curves):
        color = plt.get_cmap("tab10").colors[index % 10]
        per_seed = []
        for run in runs:
            csv_path = run.run_dir / curve.csv.replace("{seed}", str(run.seed))
            if csv_path.is_file():
                steps, minutes, values = series(csv_path, curve.column)
                if values:
                    per_seed.append((run.seed, steps, minutes, values))
        if not per_seed:
            continue
        drawn = True
        label = f"{curve.label} (seeds {', '.join(str(seed) for seed, *_ in per_seed)})"
        for axis, (x, mean, std), index_x in (
            (by_step, over_steps([(s, v) for _, s, _, v in per_seed]), 1),
            (by_minute, over_minutes([(m, v) for _, _, m, v in per_seed]), 2),
        ):
            for seed_curve in per_seed:
                axis.plot(seed_curve[index_x], seed_curve[3], color=color, alpha=0.25, linewidth=0.8)
            axis.plot(x, mean, color=color, linewidth=1.8, label=label)
            axis.fill_between(x, mean - std, mean + std, color=color, alpha=0.2, linewidth=0)
    if not drawn:
        plt.close(figure_)
        return
    column = figure.ylabel or figure.curves[0].column
    for axis, xlabel in ((by_step, "rollout step"), (by_minute, "minutes of training steps (sum of time/step_s)")):
        axis.set_xlabel(xlabel)
        axis.set_ylabel(column)
        axis.grid(alpha=0.3)
    by_step.legend(fontsize=8, loc="best")
    figure_.suptitle(f"{figure.name}: {column}, mean ± 1 std over seeds (thin: each seed)")
    figure_.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure_.savefig(path, dpi=110)
    plt.close(figure_)

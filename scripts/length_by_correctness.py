"""`scripts/compare.py --lengths`: Dr. GRPO's view of a comparison, the mean response length of correct and of
incorrect responses over training (`train/bias/length_correct` / `_incorrect`, logged by every RL module),
as a plot (`OUT_lengths.png`) and a table of the first and last steps' values.

A run is anything with `recipe`, `ok`, `length_steps`, `length_correct` and `length_incorrect` (compare.py's
`Run`); `order` is the recipes' order in the report.
"""

from __future__ import annotations

import csv
import math
import os
import statistics
import warnings
from pathlib import Path

LENGTH_CORRECT, LENGTH_INCORRECT = "train/bias/length_correct", "train/bias/length_incorrect"


def read_lengths(csv_path: Path) -> tuple[list[int], list[float], list[float]]:
    """(steps, mean length of correct responses, of incorrect ones) from a CSV log; empty without those columns."""
    steps, correct, incorrect = [], [], []
    with csv_path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row.get(LENGTH_INCORRECT, "") != "":
                steps.append(int(float(row["step"])) + 1)
                correct.append(float(row.get(LENGTH_CORRECT) or "nan"))
                incorrect.append(float(row[LENGTH_INCORRECT]))
    return steps, correct, incorrect


def _cell(values: list[float]) -> str:
    kept = [v for v in values if not math.isnan(v)]
    if not kept:
        return "—"
    mean = statistics.fmean(kept)
    return f"{mean:.2f} ± {statistics.stdev(kept):.2f}" if len(kept) > 1 else f"{mean:.2f}"


def _nanmean(values: list[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return statistics.fmean(kept) if kept else math.nan


def length_table(runs: list, order: list[str], final_window: int) -> str:
    """Mean response length of correct and incorrect responses over the first `final_window` steps, the last
    `final_window` and the whole run, per recipe: mean ± std over seeds (steps without such a response skipped)."""
    lines = [
        "| recipe | correct: first steps | last steps | whole run | incorrect: first steps | last steps | whole run |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    windows = (slice(0, final_window), slice(-final_window, None), slice(None))
    for recipe in order:
        ok = [r for r in runs if r.recipe == recipe and r.ok and r.length_incorrect]
        if not ok:
            continue
        cells = [
            _cell([_nanmean(getattr(r, series)[window]) for r in ok])
            for series in ("length_correct", "length_incorrect")
            for window in windows
        ]
        lines.append(f"| {recipe} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_lengths(runs: list, order: list[str], path: Path, title: str, smooth: int = 1) -> None:
    """Two panels: mean length of correct and of incorrect responses per rollout step, one line per recipe
    (mean over seeds, band = ± 1 std; steps without a correct response are gaps)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    colors = plt.get_cmap("tab10").colors
    for i, recipe in enumerate(order):
        ok = [r for r in runs if r.recipe == recipe and r.ok and r.length_incorrect]
        if not ok:
            continue
        length = min(len(r.length_steps) for r in ok)
        steps = np.array(ok[0].length_steps[:length])
        for axis, series in zip(axes, ("length_correct", "length_incorrect"), strict=True):
            curves = np.array([getattr(r, series)[:length] for r in ok], dtype=float)
            if smooth > 1:  # moving average that skips NaN steps
                kernel = np.ones(smooth)
                valid = ~np.isnan(curves)
                sums = np.array(
                    [
                        np.convolve(np.pad(np.where(v, c, 0), (smooth - 1, 0)), kernel, "valid")
                        for c, v in zip(curves, valid, strict=True)
                    ]
                )
                counts = np.array(
                    [np.convolve(np.pad(v.astype(float), (smooth - 1, 0)), kernel, "valid") for v in valid]
                )
                curves = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
            with np.errstate(invalid="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN steps (no correct response yet)
                mean = np.nanmean(curves, 0)
                std = np.nanstd(curves, 0, ddof=1) if len(ok) > 1 else np.zeros(length)
            axis.plot(steps, mean, color=colors[i % len(colors)], linewidth=1.6, label=f"{recipe} ({len(ok)} seeds)")
            axis.fill_between(steps, mean - std, mean + std, color=colors[i % len(colors)], alpha=0.15, linewidth=0)
    for axis, name in zip(axes, ("correct", "incorrect"), strict=True):
        axis.set_title(f"mean length of {name} responses")
        axis.set_xlabel("rollout step")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("tokens" + (f" (moving average of {smooth})" if smooth > 1 else ""))
    axes[1].legend(fontsize=8)
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def lengths_path(out: Path) -> Path:
    """`OUT_lengths.png` next to `OUT.md`."""
    return out.with_name(out.name + "_lengths").with_suffix(".png")


def report_section(runs: list, order: list[str], out: Path, final_window: int, md_path: Path) -> list[str]:
    """The Markdown lines of the report: what the table holds, the table, the plot."""
    link = os.path.relpath(lengths_path(out), md_path.parent)
    return [
        f"Mean response length (tokens) of correct and incorrect responses (`{LENGTH_CORRECT}`, `{LENGTH_INCORRECT}`), "
        f"averaged over the first and the last {final_window} steps of each run and over the whole run (steps without "
        "such a response are skipped):",
        "",
        length_table(runs, order, final_window),
        "",
        f"![length by correctness]({link})",
        "",
    ]

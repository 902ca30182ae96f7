"""The report of `compare.py`: each run's numbers from its CSV log, the Markdown table over seeds and the
plot of the reward curves (the columns are described in `compare.py`)."""

from __future__ import annotations

import argparse
import csv
import math
import os
import platform
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import length_by_correctness as lengths  # noqa: E402  (the --lengths plot and table)
import pass_at_k_report  # noqa: E402  (the --pass_at_k table)


@dataclass
class Run:
    recipe: str
    seed: int
    ok: bool = False
    error: str | None = None
    wall_s: float = math.nan
    steps: list[int] = field(default_factory=list)  # rollout steps completed (1-based)
    metric: list[float] = field(default_factory=list)
    val_steps: list[int] = field(default_factory=list)
    val_accuracy: list[float] = field(default_factory=list)
    final: float = math.nan
    final_val_accuracy: float = math.nan
    steps_to_threshold: int | None = None
    length_steps: list[int] = field(default_factory=list)  # steps of the two series below
    length_correct: list[float] = field(default_factory=list)  # NaN where the step had no correct response
    length_incorrect: list[float] = field(default_factory=list)


# ------------------------------------------------------------------ reading logs


def read_metrics(
    csv_path: Path, metric: str, accuracy: str = "val/accuracy"
) -> tuple[list[int], list[float], list[int], list[float]]:
    """(steps, metric values, validation steps, validation accuracies) from a Lightning CSV log.

    Lightning's `step` column is 0-based; the returned steps count rollout steps completed (step + 1).
    """
    steps, values, val_steps, val_values = [], [], [], []
    with csv_path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            step = int(float(row["step"])) + 1
            if row.get(metric, "") != "":
                steps.append(step)
                values.append(float(row[metric]))
            if row.get(accuracy, "") != "":
                val_steps.append(step)
                val_values.append(float(row[accuracy]))
    return steps, values, val_steps, val_values


def summarise_run(
    run: Run, csv_path: Path, metric: str, threshold: float, final_window: int, val_metric: str = "val/accuracy"
) -> Run:
    if not csv_path.is_file():
        run.ok = False
        run.error = run.error or f"no metrics at {csv_path}"
        return run
    run.steps, run.metric, run.val_steps, run.val_accuracy = read_metrics(csv_path, metric, val_metric)
    run.length_steps, run.length_correct, run.length_incorrect = lengths.read_lengths(csv_path)
    if not run.metric:
        run.ok = False
        run.error = run.error or f"{csv_path} has no {metric!r} column values"
        return run
    run.final = statistics.fmean(run.metric[-final_window:])
    run.final_val_accuracy = run.val_accuracy[-1] if run.val_accuracy else math.nan
    run.steps_to_threshold = next((s for s, v in zip(run.steps, run.metric, strict=True) if v >= threshold), None)
    return run


# ------------------------------------------------------------------ table and plot


def mean_std(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _cell(values: list[float], digits: int = 2, percent: bool = False) -> str:
    mean, std = mean_std(values)
    if math.isnan(mean):
        return "—"
    scale, unit = (100.0, "%") if percent else (1.0, "")
    return (
        f"{mean * scale:.{digits}f}{unit} ± {std * scale:.{digits}f}{unit}"
        if len(values) > 1
        else f"{mean * scale:.{digits}f}{unit}"
    )


def recipe_rows(runs: list[Run]) -> list[dict]:
    """One summary per recipe, best final metric first."""
    by_recipe: dict[str, list[Run]] = {}
    for run in runs:
        by_recipe.setdefault(run.recipe, []).append(run)
    rows = []
    for recipe, recipe_runs in by_recipe.items():
        ok = [r for r in recipe_runs if r.ok]
        reached = [r.steps_to_threshold for r in ok if r.steps_to_threshold is not None]
        rows.append(
            {
                "recipe": recipe,
                "runs": len(recipe_runs),
                "ok": len(ok),
                "final": [r.final for r in ok],
                "val_accuracy": [r.final_val_accuracy for r in ok],
                "reached": reached,
                "wall_s": [r.wall_s for r in ok],
                "errors": [f"seed {r.seed}: {r.error}" for r in recipe_runs if not r.ok],
            }
        )
    rows.sort(key=lambda row: -mean_std(row["final"])[0] if row["final"] else math.inf)
    return rows


def recipe_order(runs: list[Run]) -> list[str]:
    return [row["recipe"] for row in recipe_rows(runs)]


def val_column(val_metric: str) -> str:
    return "val accuracy" if val_metric == "val/accuracy" else f"last {val_metric}"


def markdown_table(
    runs: list[Run], metric: str, threshold: float, final_window: int, val_metric: str = "val/accuracy"
) -> str:
    lines = [
        f"| recipe | final {metric} | {val_column(val_metric)} | steps to {metric} ≥ {threshold:g} | wall time / run |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in recipe_rows(runs):
        if not row["ok"]:
            lines.append(f"| {row['recipe']} | failed | failed | — | — |")
            continue
        reached = row["reached"]
        steps = "never" if not reached else f"{statistics.fmean(reached):.0f}"
        if reached and len(reached) < row["ok"]:
            steps += f" ({len(reached)}/{row['ok']} seeds)"
        failed = f" ({row['runs'] - row['ok']} failed)" if row["ok"] < row["runs"] else ""
        lines.append(
            f"| {row['recipe']}{failed} | {_cell(row['final'])} | {_cell(row['val_accuracy'], 1, percent=True)} "
            f"| {steps} | {statistics.fmean(row['wall_s']):.0f} s |"
        )
    return "\n".join(lines)


def plot(
    runs: list[Run], metric: str, path: Path, title: str, smooth: int = 1, val_metric: str = "val/accuracy"
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = recipe_rows(runs)
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    colors = plt.get_cmap("tab10").colors
    styles = ["-", "--", "-.", ":"]
    for i, row in enumerate(rows):
        ok = [r for r in runs if r.recipe == row["recipe"] and r.ok]
        if not ok:
            continue
        color, style = colors[i % len(colors)], styles[(i // len(colors)) % len(styles)]
        length = min(len(r.metric) for r in ok)
        curves = np.array([r.metric[:length] for r in ok])
        if smooth > 1:
            kernel = np.ones(smooth) / smooth
            curves = np.array(
                [np.convolve(np.pad(c, (smooth - 1, 0), mode="edge"), kernel, mode="valid") for c in curves]
            )
        steps = np.array(ok[0].steps[:length])
        mean, std = curves.mean(0), curves.std(0, ddof=1) if len(ok) > 1 else np.zeros(length)
        left.plot(steps, mean, color=color, linestyle=style, linewidth=1.6, label=f"{row['recipe']} ({len(ok)} seeds)")
        left.fill_between(steps, mean - std, mean + std, color=color, alpha=0.15, linewidth=0)
        val_length = min(len(r.val_accuracy) for r in ok)
        if val_length:
            accuracy = np.array([r.val_accuracy[:val_length] for r in ok]) * 100
            val_steps = np.array(ok[0].val_steps[:val_length])
            val_mean = accuracy.mean(0)
            val_std = accuracy.std(0, ddof=1) if len(ok) > 1 else np.zeros(val_length)
            right.errorbar(
                val_steps, val_mean, yerr=val_std, color=color, linestyle=style, marker="o", markersize=3, capsize=2
            )
    left.set_xlabel("rollout step")
    left.set_ylabel(metric + (f" (moving average of {smooth})" if smooth > 1 else ""))
    left.set_title("reward: mean over seeds, band = ± 1 std")
    left.grid(alpha=0.3)
    left.legend(fontsize=8, loc="lower right")
    right.set_xlabel("rollout step")
    right.set_ylabel(("validation accuracy" if val_metric == "val/accuracy" else val_metric) + " (%)")
    right.set_title(("validation accuracy" if val_metric == "val/accuracy" else val_metric) + ": mean ± 1 std")
    right.grid(alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_report(
    runs: list[Run],
    args: argparse.Namespace,
    extra: list[str],
    command: str,
    total_s: float,
    md_path: Path,
    png_path: Path,
) -> str:
    failures = [f"- {r.recipe}, seed {r.seed}: {r.error}" for r in runs if not r.ok]
    seeds = sorted({r.seed for r in runs})
    try:
        png_link = os.path.relpath(png_path, md_path.parent)
    except ValueError:
        png_link = str(png_path)
    text = "\n".join(
        [
            f"# {args.title}",
            "",
            f"Command (from the repository root): `{command}`",
            "",
            f"{len({r.recipe for r in runs})} recipes x {len(seeds)} seeds ({', '.join(map(str, seeds))}), "
            f"{'in-process' if args.in_process else f'subprocesses, {args.jobs} at a time'}; "
            f"total wall time {total_s / 60:.1f} min on {os.cpu_count()} CPU cores ({platform.machine()}, "
            f"Python {platform.python_version()}, OMP_NUM_THREADS=1).",
            "",
            "Settings: each recipe's YAML as shipped"
            + (f", {args.steps} rollout steps" if args.steps else "")
            + (f", overrides `{' '.join(extra)}`" if extra else "")
            + ".",
            "",
            markdown_table(runs, args.metric, args.threshold, args.final_window, args.val_metric),
            "",
            f"- final {args.metric}: mean over the last {args.final_window} logged steps of each run; "
            "then mean ± sample std over seeds.",
            f"- {val_column(args.val_metric)}: the run's last validation (`{args.val_metric}`); mean ± sample std "
            "over seeds.",
            f"- steps to {args.metric} ≥ {args.threshold:g}: first rollout step reaching it, "
            "mean over the seeds that did.",
            (
                "- wall time: one run, from the CLI call to its return (config parsing, set-up, training and "
                "validation; no Python start-up), on a machine shared with other jobs."
                if args.in_process
                else "- wall time: one run, process start to exit "
                "(Python and Lightning start-up and validation included)."
            ),
            "",
            f"![reward curves]({png_link})",
            "",
        ]
        + (
            lengths.report_section(runs, recipe_order(runs), args.out, args.final_window, md_path)
            if args.lengths
            else []
        )
        + (
            pass_at_k_report.report_section(runs, recipe_order(runs), args.workdir)
            if getattr(args, "pass_at_k", False)
            else []
        )
        + (["Failed runs:", *failures, ""] if failures else [])
    )
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(text)
    return text

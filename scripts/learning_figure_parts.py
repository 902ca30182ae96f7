"""The parts a learning figure is made of: where a metric must lie (`Band`), how it is read from one
seed's run (`Metric` and the CSV/JSON readers), the commands that produce the run (`Command`,
`rlvr_fit`), and the `Figure` that puts them together (`scripts/learning_figures.py` lists them)."""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Band:
    """Where a metric must lie: `lo <= value <= hi` (either bound may be open), for every seed's value
    (`over="each"`) or for the mean over seeds (`over="mean"`)."""

    lo: float | None = None
    hi: float | None = None
    over: str = "each"

    def __post_init__(self) -> None:
        if self.over not in ("each", "mean"):
            raise ValueError(f"Band over={self.over!r} is not valid; choose one of 'each', 'mean'")
        if self.lo is None and self.hi is None:
            raise ValueError("Band needs lo, hi or both")

    def holds(self, value: float) -> bool:
        if value is None or math.isnan(value):
            return False
        return (self.lo is None or value >= self.lo) and (self.hi is None or value <= self.hi)

    def describe(self, percent: bool = False) -> str:
        show = (lambda v: f"{100 * v:.1f}%") if percent else (lambda v: f"{v:g}")
        if self.lo is not None and self.hi is not None:
            text = f"[{show(self.lo)}, {show(self.hi)}]"
        elif self.lo is not None:
            text = f">= {show(self.lo)}"
        else:
            text = f"<= {show(self.hi)}"
        return f"{text} {'every seed' if self.over == 'each' else 'mean'}"


@dataclass(frozen=True)
class Metric:
    name: str
    read: Callable[[Path, int], float]  # (one seed's run directory, seed) -> value
    band: Band
    source: str  # how it is read, in words
    percent: bool = False  # shown as a percentage


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    cwd: str = "run_dir"  # or "repo"
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Curve:
    """One line of `--plot`: a column of a CSV log, per seed (path relative to the run directory)."""

    label: str
    csv: str
    column: str = "val/accuracy"


@dataclass(frozen=True)
class Figure:
    name: str
    published: str  # where the documentation shows it
    commands: tuple[Command, ...]
    metrics: tuple[Metric, ...]
    seeds: tuple[int, ...] = (0, 1, 2)
    quick: bool = False
    curves: tuple[Curve, ...] = field(default_factory=tuple)
    ylabel: str = ""  # what the curves show, when they are not one column's
    # its seeds run with no other run beside them, whatever --jobs says: its bands read wall-clock time (a training
    # budget in minutes, step times), which a second run on the machine's cores would change
    alone: bool = False


# ------------------------------------------------------------------ reading one run's output


def csv_column(path: Path, column: str) -> list[float]:
    """The non-empty values of `column` in a Lightning CSV log, in order."""
    with path.open(newline="") as handle:
        return [float(row[column]) for row in csv.DictReader(handle) if row.get(column) not in (None, "")]


def csv_final(path: str, column: str, window: int = 1) -> Callable[[Path, int], float]:
    """The mean of the last `window` values of `column` (window 1: the last value)."""

    def read(run_dir: Path, seed: int) -> float:
        values = csv_column(run_dir / path.replace("{seed}", str(seed)), column)
        return statistics.fmean(values[-window:]) if values else math.nan

    return read


def csv_mean(path: str, column: str) -> Callable[[Path, int], float]:
    """The mean of `column` over the whole run, NaN rows left out."""

    def read(run_dir: Path, seed: int) -> float:
        values = [v for v in csv_column(run_dir / path.replace("{seed}", str(seed)), column) if not math.isnan(v)]
        return statistics.fmean(values) if values else math.nan

    return read


def csv_nth(path: str, column: str, index: int) -> Callable[[Path, int], float]:
    def read(run_dir: Path, seed: int) -> float:
        return csv_column(run_dir / path.replace("{seed}", str(seed)), column)[index]

    return read


def json_value(path: str, *keys: str) -> Callable[[Path, int], float]:
    def read(run_dir: Path, seed: int) -> float:
        value = json.loads((run_dir / path.replace("{seed}", str(seed))).read_text())
        for key in keys:
            value = value[int(key)] if isinstance(value, list) else value[key]
        return float(value)

    return read


def difference(
    first: Callable[[Path, int], float], second: Callable[[Path, int], float]
) -> Callable[[Path, int], float]:
    """first - second, on the same seed's run (a comparison that must hold on every seed)."""
    return lambda run_dir, seed: first(run_dir, seed) - second(run_dir, seed)


def ratio(first: Callable[[Path, int], float], second: Callable[[Path, int], float]) -> Callable[[Path, int], float]:
    """first / second, on the same seed's run (NaN, which holds no band, where second is 0)."""

    def read(run_dir: Path, seed: int) -> float:
        denominator = second(run_dir, seed)
        return first(run_dir, seed) / denominator if denominator else math.nan

    return read


# ------------------------------------------------------------------ how runs are made

CSV_LOG = "csv/version_0/metrics.csv"


def rlvr_fit(config: str, *extra: str, cwd: str = "run_dir", log_name: str = "csv", subcommand: str = "fit") -> Command:
    """`rlvr fit --config CONFIG --seed_everything SEED` (or another subcommand: `validate`) on one thread, logging to
    a CSV file in the run directory only (no W&B, no progress bar): `{run_dir}/LOG_NAME/version_0/metrics.csv`,
    flushed as the run goes (`flush_logs_every_n_steps: 10`) so that a long run can be followed."""
    init_args = f'{{"save_dir": "{{run_dir}}", "name": "{log_name}", "version": 0, "flush_logs_every_n_steps": 10}}'
    logger = f'{{"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {init_args}}}'
    return Command(
        (
            "{python}",
            "-m",
            "rlvr_lightning.cli",
            subcommand,
            "--config",
            "{repo}/" + config,
            "--seed_everything={seed}",
            "--torch_threads=1",
            "--trainer.logger=" + logger,
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            "--trainer.default_root_dir={run_dir}",
            *extra,
        ),
        cwd=cwd,
    )


def toy_metrics(
    csv_path: str = CSV_LOG, reward: Band | None = None, accuracy: Band | None = None, prefix: str = ""
) -> tuple[Metric, ...]:
    """The sort task's two figures: final train reward (mean of the last 10 steps) and val exact-sort
    (the last validation)."""
    return (
        Metric(
            f"{prefix}final_train_reward",
            csv_final(csv_path, "train/reward_mean", 10),
            reward,
            f"mean of train/reward_mean over the last 10 steps of {csv_path}",
        ),
        Metric(
            f"{prefix}val_exact_sort",
            csv_final(csv_path, "val/accuracy"),
            accuracy,
            f"last val/accuracy (greedy exact-sort, 256 held-out prompts) of {csv_path}",
            percent=True,
        ),
    )


# ------------------------------------------------------------------ the registry

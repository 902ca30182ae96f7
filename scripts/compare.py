#!/usr/bin/env python
"""Run recipes for several seeds and compare them: a Markdown table and a PNG of the reward curves.

    python scripts/compare.py                                   # every RL recipe in configs/recipes (RLVRModule, PPOModule), seeds 0 1 2
    python scripts/compare.py --in_process --out docs/compare_sort   # as docs/benchmarks.md's table (rewrites the tracked files)
    python scripts/compare.py --recipes configs/recipes/grpo.yaml configs/recipes/dapo.yaml --seeds 0 1 \
        --steps 100 --out docs/compare_small -- --data.init_args.batch_size=64

Each run is `rlvr fit --config RECIPE --seed_everything SEED` with a CSV logger only, no progress
bar and no checkpoints, in a subprocess with OMP_NUM_THREADS=1 (`--in_process` runs them in this
process instead; `--jobs N` runs N subprocesses at a time). Arguments after `--` go to every run.
The runs' logs land in `--workdir/RECIPE/seed_SEED/metrics.csv`; the table goes to `OUT.md`, the
plot to `OUT.png`, every number per run to `--workdir/summary.json`. `--lengths` adds Dr. GRPO's view:
the mean response length of correct and of incorrect responses over training (`train/bias/length_*`,
logged by every RL module) as `OUT_lengths.png` and a table of their final values.

Table columns, per recipe, over seeds (mean ± sample std):
  final reward     mean of the metric (`--metric`, default train/reward_mean) over the last `--final_window` steps
  val accuracy     the last validation accuracy (`val/accuracy`) of the run
  steps to X       first rollout step at which the metric reaches `--threshold` (mean over the seeds that
                   reached it; "k/n" when only k of n seeds did)
  wall time        seconds per run (process start to exit: includes Python and Lightning start-up and validation)
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import length_by_correctness as lengths  # noqa: E402  (the --lengths plot and table)
RL_MODULES = ("rlvr_lightning.modules.RLVRModule", "rlvr_lightning.modules.rlvr.RLVRModule", "rlvr_lightning.modules.PPOModule", "rlvr_lightning.modules.ppo.PPOModule")


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




# ------------------------------------------------------------------ recipes


def default_recipes(directory: Path = REPO / "configs" / "recipes") -> list[Path]:
    """Every recipe in `directory` that trains an `RLVRModule` or a `PPOModule` (SFT / expert-iteration stages need their own data)."""
    import yaml

    recipes = []
    for path in sorted(directory.glob("*.yaml")):
        config = yaml.safe_load(path.read_text()) or {}
        model = config.get("model") or {}
        if isinstance(model, dict) and model.get("class_path", RL_MODULES[0]) in RL_MODULES:
            recipes.append(path)
    return recipes


def run_arguments(recipe: Path, seed: int, workdir: Path, steps: int | None, extra: list[str]) -> list[str]:
    logger = {
        "class_path": "lightning.pytorch.loggers.CSVLogger",
        "init_args": {"save_dir": str(workdir), "name": recipe.stem, "version": f"seed_{seed}"},
    }
    args = [
        "fit",
        "--config", str(recipe),
        f"--seed_everything={seed}",
        f"--trainer.logger={json.dumps(logger)}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={workdir / recipe.stem / f'seed_{seed}'}",
    ]
    if steps is not None:
        args.append(f"--trainer.limit_train_batches={steps}")
    return args + list(extra)


def launch(recipe: Path, seed: int, workdir: Path, steps: int | None, extra: list[str], in_process: bool) -> Run:
    """One training run; its metrics are read back from the CSV log."""
    run = Run(recipe=recipe.stem, seed=seed)
    run_dir = workdir / recipe.stem / f"seed_{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    args = run_arguments(recipe, seed, workdir, steps, extra)
    started = time.perf_counter()
    if in_process:
        import torch

        from rlvr_lightning.cli import main

        torch.set_num_threads(1)
        try:
            main(args)
            run.ok = True
        except (Exception, SystemExit) as error:  # a failed run is reported, the comparison goes on
            run.error = f"{type(error).__name__}: {error}"
    else:
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", WANDB_MODE="offline", WANDB_SILENT="true")
        with (run_dir / "output.log").open("w") as log:
            process = subprocess.run(
                [sys.executable, "-m", "rlvr_lightning.cli", *args], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO
            )
        run.ok = process.returncode == 0
        if not run.ok:
            tail = (run_dir / "output.log").read_text(errors="replace").strip().splitlines()[-5:]
            run.error = f"exit code {process.returncode}: " + " | ".join(tail)
    run.wall_s = time.perf_counter() - started
    return run


# ------------------------------------------------------------------ reading logs


def read_metrics(csv_path: Path, metric: str, accuracy: str = "val/accuracy") -> tuple[list[int], list[float], list[int], list[float]]:
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


def summarise_run(run: Run, csv_path: Path, metric: str, threshold: float, final_window: int) -> Run:
    if not csv_path.is_file():
        run.ok = False
        run.error = run.error or f"no metrics at {csv_path}"
        return run
    run.steps, run.metric, run.val_steps, run.val_accuracy = read_metrics(csv_path, metric)
    run.length_steps, run.length_correct, run.length_incorrect = lengths.read_lengths(csv_path)
    if not run.metric:
        run.ok = False
        run.error = run.error or f"{csv_path} has no {metric!r} column values"
        return run
    run.final = statistics.fmean(run.metric[-final_window:])
    run.final_val_accuracy = run.val_accuracy[-1] if run.val_accuracy else math.nan
    run.steps_to_threshold = next((s for s, v in zip(run.steps, run.metric) if v >= threshold), None)
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
    return f"{mean * scale:.{digits}f}{unit} ± {std * scale:.{digits}f}{unit}" if len(values) > 1 else f"{mean * scale:.{digits}f}{unit}"


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


def _recipe_order(runs: list[Run]) -> list[str]:
    return [row["recipe"] for row in recipe_rows(runs)]


def markdown_table(runs: list[Run], metric: str, threshold: float, final_window: int) -> str:
    lines = [
        f"| recipe | final {metric} | val accuracy | steps to {metric} ≥ {threshold:g} | wall time / run |",
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


def plot(runs: list[Run], metric: str, path: Path, title: str, smooth: int = 1) -> None:
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
            curves = np.array([np.convolve(np.pad(c, (smooth - 1, 0), mode="edge"), kernel, mode="valid") for c in curves])
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
            right.errorbar(val_steps, val_mean, yerr=val_std, color=color, linestyle=style, marker="o", markersize=3, capsize=2)
    left.set_xlabel("rollout step")
    left.set_ylabel(metric + (f" (moving average of {smooth})" if smooth > 1 else ""))
    left.set_title("reward: mean over seeds, band = ± 1 std")
    left.grid(alpha=0.3)
    left.legend(fontsize=8, loc="lower right")
    right.set_xlabel("rollout step")
    right.set_ylabel("validation accuracy (%)")
    right.set_title("validation accuracy: mean ± 1 std")
    right.grid(alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_report(
    runs: list[Run], args: argparse.Namespace, extra: list[str], command: str, total_s: float, md_path: Path, png_path: Path
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
            markdown_table(runs, args.metric, args.threshold, args.final_window),
            "",
            f"- final {args.metric}: mean over the last {args.final_window} logged steps of each run; then mean ± sample std over seeds.",
            "- val accuracy: the run's last validation (`val/accuracy`); mean ± sample std over seeds.",
            f"- steps to {args.metric} ≥ {args.threshold:g}: first rollout step reaching it, mean over the seeds that did.",
            (
                "- wall time: one run, from the CLI call to its return (config parsing, set-up, training and validation; "
                "no Python start-up), on a machine shared with other jobs."
                if args.in_process
                else "- wall time: one run, process start to exit (Python and Lightning start-up and validation included)."
            ),
            "",
            f"![reward curves]({png_link})",
            "",
        ]
        + (lengths.report_section(runs, _recipe_order(runs), args.out, args.final_window, md_path) if args.lengths else [])
        + (["Failed runs:", *failures, ""] if failures else [])
    )
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(text)
    return text


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipes", nargs="+", type=Path, help="recipe YAML files (default: every RLVRModule and PPOModule recipe in configs/recipes)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="rollout steps per run (default: each recipe's limit_train_batches)")
    parser.add_argument("--metric", default="train/reward_mean", help="the logged metric to compare (default: %(default)s)")
    parser.add_argument("--threshold", type=float, default=6.5, help="'steps to threshold' level of --metric (default: %(default)s)")
    parser.add_argument("--final_window", type=int, default=10, help="steps averaged for the final metric (default: %(default)s)")
    parser.add_argument("--smooth", type=int, default=1, help="moving-average window of the plotted curves (default: none)")
    parser.add_argument(
        "--out", type=Path, default=REPO / "runs" / "compare" / "compare_sort",
        help="writes OUT.md and OUT.png (default: %(default)s; the documentation's are docs/compare_sort)",
    )
    parser.add_argument("--workdir", type=Path, default=REPO / "runs" / "compare", help="run logs and summary.json")
    parser.add_argument("--jobs", type=int, default=1, help="subprocesses at a time")
    parser.add_argument("--in_process", action="store_true", help="run in this process (no start-up cost; one at a time)")
    parser.add_argument("--title", default="Recipes on the sort task")
    parser.add_argument("--report_only", action="store_true", help="rebuild OUT.md and OUT.png from --workdir/summary.json, run nothing")
    parser.add_argument(
        "--lengths", action="store_true",
        help="also plot the mean length of correct and incorrect responses (OUT_lengths.png) and tabulate it",
    )
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.final_window < 1 or args.smooth < 1:
        parser.error("--jobs, --final_window and --smooth must be >= 1")
    if args.in_process and args.jobs != 1:
        parser.error("--in_process runs one at a time; drop --jobs")
    return args, extra


def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(argv)
    if args.report_only:
        return report_from_summary(args, extra)
    recipes = [path.resolve() for path in (args.recipes or default_recipes())]
    missing = [str(path) for path in recipes if not path.is_file()]
    if missing or not recipes:
        raise SystemExit(f"compare.py: recipe(s) not found: {missing or 'none given and none in configs/recipes'}")
    workdir = args.workdir.resolve()
    command = "python scripts/compare.py " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    jobs = [(recipe, seed) for recipe in recipes for seed in args.seeds]
    print(f"compare.py: {len(recipes)} recipes x {len(args.seeds)} seeds = {len(jobs)} runs -> {workdir}", flush=True)
    started = time.perf_counter()

    def one(job: tuple[Path, int]) -> Run:
        recipe, seed = job
        run = launch(recipe, seed, workdir, args.steps, extra, args.in_process)
        run = summarise_run(run, workdir / recipe.stem / f"seed_{seed}" / "metrics.csv", args.metric, args.threshold, args.final_window)
        status = f"final {run.final:.3f}, val acc {run.final_val_accuracy:.3f}" if run.ok else f"FAILED ({run.error})"
        print(f"  {recipe.stem} seed {seed}: {status}, {run.wall_s:.1f} s", flush=True)
        return run

    if args.jobs == 1:
        runs = [one(job) for job in jobs]
    else:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            runs = list(pool.map(one, jobs))
    total = time.perf_counter() - started

    md_path, png_path = args.out.with_suffix(".md"), args.out.with_suffix(".png")
    plot(runs, args.metric, png_path, args.title, smooth=args.smooth)
    if args.lengths:
        lengths.plot_lengths(runs, _recipe_order(runs), lengths.lengths_path(args.out), args.title, smooth=args.smooth)
    text = write_report(runs, args, extra, command, total, md_path, png_path)
    workdir.mkdir(parents=True, exist_ok=True)
    summary = {"command": command, "total_s": total, "extra": extra, "in_process": args.in_process, "jobs": args.jobs, "steps": args.steps}
    (workdir / "summary.json").write_text(json.dumps({**summary, "runs": [asdict(r) for r in runs]}, indent=1))
    print(text)
    print(f"compare.py: wrote {md_path} and {png_path} in {total / 60:.1f} min", flush=True)
    return 0 if all(run.ok for run in runs) else 1


def report_from_summary(args: argparse.Namespace, extra: list[str]) -> int:
    """The table and plot again from a finished comparison (e.g. after changing the plot), with its command and settings."""
    summary = json.loads((args.workdir / "summary.json").read_text())
    runs = [Run(**run) for run in summary["runs"]]
    for key in ("in_process", "jobs", "steps"):
        if key in summary:
            setattr(args, key, summary[key])
    md_path, png_path = args.out.with_suffix(".md"), args.out.with_suffix(".png")
    plot(runs, args.metric, png_path, args.title, smooth=args.smooth)
    if args.lengths:
        lengths.plot_lengths(runs, _recipe_order(runs), lengths.lengths_path(args.out), args.title, smooth=args.smooth)
    print(write_report(runs, args, summary.get("extra", extra), summary["command"], summary["total_s"], md_path, png_path))
    return 0 if all(run.ok for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())

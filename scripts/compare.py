#!/usr/bin/env python
"""Run recipes for several seeds and compare them: a Markdown table and a PNG of the reward curves.

    # every RL recipe in configs/recipes (RLVRModule, PPOModule), seeds 0 1 2
    python scripts/compare.py
    # as docs/benchmarks.md's table (rewrites the tracked files)
    python scripts/compare.py --in_process --out docs/compare_sort
    python scripts/compare.py --recipes configs/recipes/grpo.yaml configs/recipes/dapo.yaml --seeds 0 1 \
        --steps 100 --out docs/compare_small -- --data.init_args.batch_size=64

Each run is `rlvr fit --config RECIPE --seed_everything SEED` with a CSV logger only, no progress
bar and no checkpoints, in a subprocess with OMP_NUM_THREADS=1 (`--in_process` runs them in this
process instead; `--jobs N` runs N subprocesses at a time). Arguments after `--` go to every run.
The runs' logs land in `--workdir/RECIPE/seed_SEED/metrics.csv`; the table goes to `OUT.md`, the
plot to `OUT.png`, every number per run to `--workdir/summary.json`. `--pass_at_k` adds a table of the last
validation's pass@k for every k the runs logged (sampled validation with `validation.pass_at_k`). `--lengths` adds
Dr. GRPO's view: the mean response length of correct and of incorrect responses over training
(`train/bias/length_*`, logged by every RL module) as `OUT_lengths.png` and a table of their final values.

Table columns, per recipe, over seeds (mean ± sample std):
  final reward     mean of the metric (`--metric`, default train/reward_mean) over the last `--final_window` steps
  val accuracy     the last validation accuracy (`val/accuracy`, or `--val_metric`: e.g. val/pass@32 with sampled
                   validation) of the run
  steps to X       first rollout step at which the metric reaches `--threshold` (mean over the seeds that
                   reached it; "k/n" when only k of n seeds did)
  wall time        seconds per run (process start to exit: includes Python and Lightning start-up and validation)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import length_by_correctness as lengths  # noqa: E402  (the --lengths plot and table)
from compare_report import Run, markdown_table, plot, recipe_order, summarise_run, write_report  # noqa: E402,F401

RL_MODULES = (
    "rlvr_lightning.modules.RLVRModule",
    "rlvr_lightning.modules.RLVRModule",
    "rlvr_lightning.modules.PPOModule",
    "rlvr_lightning.modules.PPOModule",
)


# ------------------------------------------------------------------ recipes


def default_recipes(directory: Path = REPO / "configs" / "recipes") -> list[Path]:
    """Every recipe in `directory` that trains an `RLVRModule` or a `PPOModule`.

    SFT and expert-iteration stages are left out: they need their own data.
    """
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
        "--config",
        str(recipe),
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

        from rlvr_lightning.cli.app import main

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
                [sys.executable, "-m", "rlvr_lightning.cli", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
            )
        run.ok = process.returncode == 0
        if not run.ok:
            tail = (run_dir / "output.log").read_text(errors="replace").strip().splitlines()[-5:]
            run.error = f"exit code {process.returncode}: " + " | ".join(tail)
    run.wall_s = time.perf_counter() - started
    return run


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--recipes",
        nargs="+",
        type=Path,
        help="recipe YAML files (default: every RLVRModule and PPOModule recipe in configs/recipes)",
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument(
        "--steps", type=int, default=None, help="rollout steps per run (default: each recipe's limit_train_batches)"
    )
    parser.add_argument(
        "--metric", default="train/reward_mean", help="the logged metric to compare (default: %(default)s)"
    )
    parser.add_argument(
        "--val_metric",
        default="val/accuracy",
        help="the validation metric of the table's and the plot's accuracy column (default: %(default)s)",
    )
    parser.add_argument(
        "--threshold", type=float, default=6.5, help="'steps to threshold' level of --metric (default: %(default)s)"
    )
    parser.add_argument(
        "--final_window", type=int, default=10, help="steps averaged for the final metric (default: %(default)s)"
    )
    parser.add_argument(
        "--smooth", type=int, default=1, help="moving-average window of the plotted curves (default: none)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "runs" / "compare" / "compare_sort",
        help="writes OUT.md and OUT.png (default: %(default)s; the documentation's are docs/compare_sort)",
    )
    parser.add_argument("--workdir", type=Path, default=REPO / "runs" / "compare", help="run logs and summary.json")
    parser.add_argument("--jobs", type=int, default=1, help="subprocesses at a time")
    parser.add_argument(
        "--in_process", action="store_true", help="run in this process (no start-up cost; one at a time)"
    )
    parser.add_argument("--title", default="Recipes on the sort task")
    parser.add_argument(
        "--report_only", action="store_true", help="rebuild OUT.md and OUT.png from --workdir/summary.json, run nothing"
    )
    parser.add_argument(
        "--pass_at_k",
        action="store_true",
        help="also tabulate the last validation's pass@k for every k the runs logged (validation.pass_at_k)",
    )
    parser.add_argument(
        "--lengths",
        action="store_true",
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
        csv_path = workdir / recipe.stem / f"seed_{seed}" / "metrics.csv"
        run = summarise_run(run, csv_path, args.metric, args.threshold, args.final_window, args.val_metric)
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
    plot(runs, args.metric, png_path, args.title, smooth=args.smooth, val_metric=args.val_metric)
    if args.lengths:
        lengths.plot_lengths(runs, recipe_order(runs), lengths.lengths_path(args.out), args.title, smooth=args.smooth)
    text = write_report(runs, args, extra, command, total, md_path, png_path)
    workdir.mkdir(parents=True, exist_ok=True)
    summary = {
        "command": command,
        "total_s": total,
        "extra": extra,
        "in_process": args.in_process,
        "jobs": args.jobs,
        "steps": args.steps,
    }
    (workdir / "summary.json").write_text(json.dumps({**summary, "runs": [asdict(r) for r in runs]}, indent=1))
    print(text)
    print(f"compare.py: wrote {md_path} and {png_path} in {total / 60:.1f} min", flush=True)
    return 0 if all(run.ok for run in runs) else 1


def report_from_summary(args: argparse.Namespace, extra: list[str]) -> int:
    """The table and plot again from a finished comparison (e.g. after changing the plot), with its command
    and settings."""
    summary = json.loads((args.workdir / "summary.json").read_text())
    runs = [Run(**run) for run in summary["runs"]]
    for key in ("in_process", "jobs", "steps"):
        if key in summary:
            setattr(args, key, summary[key])
    md_path, png_path = args.out.with_suffix(".md"), args.out.with_suffix(".png")
    plot(runs, args.metric, png_path, args.title, smooth=args.smooth, val_metric=args.val_metric)
    if args.lengths:
        lengths.plot_lengths(runs, recipe_order(runs), lengths.lengths_path(args.out), args.title, smooth=args.smooth)
    print(
        write_report(runs, args, summary.get("extra", extra), summary["command"], summary["total_s"], md_path, png_path)
    )
    return 0 if all(run.ok for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Rerun the documentation's learning figures over their seeds and check every seed against its band.

    # the toy figures (sort task): about 15 minutes on one thread
    python scripts/learning_suite.py --quick
    python scripts/learning_suite.py --only sort_grpo 'recipe_*' --seeds 0 1
    # language models: an hour per seed
    python scripts/learning_suite.py --only smollm2_arithmetic --plot
    # every figure: commands, seeds, metrics, bands
    python scripts/learning_suite.py --list

The figures, their commands, metrics and bands are the registry in scripts/learning_figures.py. Every
seed of every figure runs in fresh processes (its command(s), in an empty directory
`--workdir/FIGURE/seed_SEED`), with one torch thread (OMP_NUM_THREADS=1, MKL_NUM_THREADS=1; `rlvr`
pins torch's intra-op threads to 1 too), so no run can inherit another's RNG state, and with torch's and MKL's
CPU kernels pinned to AVX2 as `tests/golden` pins them (`PINNED_CPU_KERNELS`), so that a seed gives the same
trajectory on every x86-64 machine with AVX2 of one vendor (an Intel Xeon's part from an AMD EPYC's after a few
steps; the bands hold both); `--native_kernels` lets torch pick (AVX-512 where the CPU has it).
Each metric is read from the run's CSV/JSON output and checked against its band; a table (figure, metric, seed,
value, band, PASS/FAIL) is printed, and the exit status is 1 when anything failed.

For each figure `--figures_dir/FIGURE.json` (default docs/figures/) records the values per seed, mean,
std, band, commands, date and the environment the runs had (rlvr_lightning.runtime.run_environment);
`--plot` adds `FIGURE.png`, the figure's curves over seeds (mean and ± 1 std band, each seed thin)
against rollout steps and against minutes of training steps (the sum of `time/step_s`).
`--no_run` checks, records and plots the runs already in `--workdir`.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import math
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import learning_figures  # noqa: E402
from compare_report import mean_std  # noqa: E402
from learning_figures import Figure  # noqa: E402

from rlvr_lightning.runtime.run_environment import PINNED_CPU_KERNELS  # noqa: E402

ONE_THREAD = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
}
ENVIRONMENT_FILE = "environment.json"
# a failed command's own words: an exception's line in a traceback, or the `rlvr` console script's `error:`
EXCEPTION_LINE = re.compile(r"^(error: |[\w.]*(Error|Exception|Interrupt)(: |$))")


@dataclass
class SeedRun:
    figure: str
    seed: int
    run_dir: Path
    error: str | None = None
    wall_s: float = math.nan
    values: dict[str, float] = field(default_factory=dict)


def children_cpu_s() -> float:
    """User + system CPU seconds of this process's finished children (every run's processes)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def render(text: str, repo: Path, run_dir: Path, seed: int) -> str:
    for key, value in (
        ("{python}", sys.executable),
        ("{repo}", str(repo)),
        ("{run_dir}", str(run_dir)),
        ("{seed}", str(seed)),
    ):
        text = text.replace(key, value)
    return text


def shown(figure: Figure) -> list[str]:
    """The figure's commands as text, placeholders kept (what the record and --list show)."""
    lines = []
    for command in figure.commands:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in command.env)
        text = (
            " ".join(shlex.quote(a) for a in command.argv).replace("'{python}'", "python").replace("{python}", "python")
        )
        lines.append(f"(in {{{command.cwd}}}) " + (env + " " if env else "") + text)
    return lines


def child_environment(repo: Path, native_kernels: bool = False) -> dict[str, str]:
    """The environment variables of every run: one thread, the CPU kernels pinned (unless `native_kernels`);
    `repo`'s code first on the path."""
    return {
        **os.environ,
        **ONE_THREAD,
        **({} if native_kernels else PINNED_CPU_KERNELS),
        "PYTHONPATH": os.pathsep.join([str(repo), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }


def runs_environment(repo: Path, native_kernels: bool = False) -> dict:
    """`environment_record()` as the runs see it: computed in a child process with their variables (threads)."""
    script = (
        "import json, sys; from rlvr_lightning.runtime.run_environment import environment_record; "
        "print(json.dumps(environment_record(sys.argv[1])))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(repo)],
        env=child_environment(repo, native_kernels),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def failure(log: Path) -> str:
    """What a failed command's log says went wrong: the first exception of a traceback (Python prints a chain's
    root cause first, and a parser's wrapper of it last) or an `error:` line, else the log's last three lines."""
    lines = log.read_text(errors="replace").strip().splitlines()
    for line in lines:
        if EXCEPTION_LINE.match(line):
            return line.strip()
    return " | ".join(lines[-3:])


def run_seed(
    figure: Figure, seed: int, workdir: Path, repo: Path, environment: dict, native_kernels: bool = False
) -> SeedRun:
    """One seed of a figure: its commands in order, each a fresh process, in an emptied run directory."""
    run_dir = (workdir / figure.name / f"seed_{seed}").resolve()
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    (run_dir / ENVIRONMENT_FILE).write_text(json.dumps({**environment, "date": date}, indent=1) + "\n")
    result = SeedRun(figure.name, seed, run_dir)
    started = time.perf_counter()
    for index, command in enumerate(figure.commands):
        argv = [render(a, repo, run_dir, seed) for a in command.argv]
        env = {**child_environment(repo, native_kernels), **{k: render(v, repo, run_dir, seed) for k, v in command.env}}
        log = run_dir / f"command_{index}.log"
        with log.open("w") as handle:
            done = subprocess.run(
                argv, cwd=repo if command.cwd == "repo" else run_dir, env=env, stdout=handle, stderr=subprocess.STDOUT
            )
        if done.returncode != 0:
            result.error = f"command {index + 1} exited with {done.returncode} ({log}): {failure(log)}"
            break
    result.wall_s = time.perf_counter() - started
    return result


def read_values(figure: Figure, run: SeedRun) -> SeedRun:
    if run.error:
        return run
    for metric in figure.metrics:
        try:
            run.values[metric.name] = float(metric.read(run.run_dir, run.seed))
        except (OSError, KeyError, IndexError, ValueError) as error:
            run.values[metric.name] = math.nan
            run.error = run.error or f"{metric.name}: cannot read it ({type(error).__name__}: {error})"
    return run


def check(figure: Figure, runs: list[SeedRun]) -> tuple[list[list[str]], dict]:
    """Table rows (figure, metric, seed, value, band, result) and the figure's record."""
    rows, metrics = [], {}
    for metric in figure.metrics:
        values = {run.seed: run.values.get(metric.name, math.nan) for run in runs}
        show = (
            (lambda v: "—" if math.isnan(v) else f"{100 * v:.1f}%")
            if metric.percent
            else (lambda v: "—" if math.isnan(v) else f"{v:.3f}")
        )
        band = metric.band.describe(metric.percent)
        mean, std = mean_std(list(values.values()))
        if metric.band.over == "each":
            verdicts = {seed: metric.band.holds(value) for seed, value in values.items()}
            passed = all(verdicts.values())
            for seed, value in values.items():
                rows.append(
                    [figure.name, metric.name, str(seed), show(value), band, "PASS" if verdicts[seed] else "FAIL"]
                )
        else:
            passed = all(not math.isnan(v) for v in values.values()) and metric.band.holds(mean)
            for seed, value in values.items():
                rows.append([figure.name, metric.name, str(seed), show(value), "", ""])
            rows.append([figure.name, metric.name, "mean", show(mean), band, "PASS" if passed else "FAIL"])
        metrics[metric.name] = {
            "values": {str(seed): value for seed, value in values.items()},
            "mean": mean,
            "std": std,
            "band": {"lo": metric.band.lo, "hi": metric.band.hi, "over": metric.band.over, "text": band},
            "read": metric.source,
            "pass": passed,
        }
    for run in runs:
        if run.error:
            rows.append([figure.name, "(run)", str(run.seed), "error", "see above", "FAIL"])
    record = {
        "figure": figure.name,
        "published": figure.published,
        "date": datetime.date.today().isoformat(),
        "check": f"python scripts/learning_suite.py --only {figure.name} --seeds {' '.join(str(r.seed) for r in runs)}",
        "commands": shown(figure),
        "seeds": [run.seed for run in runs],
        "pass": all(m["pass"] for m in metrics.values()) and not any(run.error for run in runs),
        "metrics": metrics,
        "wall_s": {str(run.seed): round(run.wall_s, 1) for run in runs if not math.isnan(run.wall_s)},
        "errors": {str(run.seed): run.error for run in runs if run.error},
        "environment": environments(runs),
    }
    return rows, record


def environments(runs: list[SeedRun]) -> dict:
    """The runs' environment: one record when the seeds ran alike (dates aside), else one per seed."""
    records = {}
    for run in runs:
        path = run.run_dir / ENVIRONMENT_FILE
        records[str(run.seed)] = json.loads(path.read_text()) if path.is_file() else None
    alike = {json.dumps({k: v for k, v in (r or {}).items() if k != "date"}, sort_keys=True) for r in records.values()}
    return next(iter(records.values())) if len(alike) == 1 and records else {"per_seed": records}


def print_table(rows: list[list[str]]) -> None:
    header = ["figure", "metric", "seed", "value", "band", "result"]
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def select(args: argparse.Namespace, figures: tuple[Figure, ...]) -> list[Figure]:
    names = [figure.name for figure in figures]
    if args.only:
        unknown = [pattern for pattern in args.only if not fnmatch.filter(names, pattern)]
        if unknown:
            raise SystemExit(
                f"learning_suite.py: --only {' '.join(unknown)} names no figure; valid: {', '.join(names)}"
            )
        return [figure for figure in figures if any(fnmatch.fnmatch(figure.name, pattern) for pattern in args.only)]
    if args.quick:
        return [figure for figure in figures if figure.quick]
    return list(figures)


def list_figures(figures: list[Figure]) -> None:
    for figure in figures:
        print(
            f"{figure.name}{'  [quick]' if figure.quick else ''}{'  [alone]' if figure.alone else ''}  "
            f"seeds {' '.join(map(str, figure.seeds))}  "
            f"({figure.published})"
        )
        for line in shown(figure):
            print(f"    run: {line}")
        for metric in figure.metrics:
            print(f"    {metric.name}: {metric.band.describe(metric.percent)}; {metric.source}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="+", metavar="NAME", help="figures by name (shell patterns: 'recipe_*')")
    parser.add_argument("--quick", action="store_true", help="the toy figures only (sort task, minutes on a CPU)")
    parser.add_argument("--seeds", nargs="+", type=int, help="instead of each figure's seeds")
    parser.add_argument(
        "--list", action="store_true", help="print the figures, commands, metrics and bands; run nothing"
    )
    parser.add_argument("--plot", action="store_true", help="also draw each figure's curves over seeds (FIGURE.png)")
    parser.add_argument("--no_run", action="store_true", help="check, record and plot the runs already in --workdir")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="seed runs at a time (each on one thread; default %(default)s); a figure listed [alone] runs its seeds "
        "one at a time after the others",
    )
    parser.add_argument(
        "--native_kernels",
        action="store_true",
        help="let torch and MKL pick their CPU kernels (default: pinned to AVX2, as the records were made)",
    )
    parser.add_argument("--workdir", type=Path, default=REPO / "runs" / "learning_suite")
    parser.add_argument(
        "--figures_dir", type=Path, default=REPO / "docs" / "figures", help="where FIGURE.json (and .png) go"
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: must be >= 1")
    return args


def main(argv: list[str] | None = None, figures: tuple[Figure, ...] | None = None, repo: Path = REPO) -> int:
    args = parse_args(argv)
    selected = select(args, learning_figures.FIGURES if figures is None else figures)
    if args.list:
        list_figures(selected)
        return 0
    environment = None if args.no_run else runs_environment(repo, args.native_kernels)
    jobs = [(figure, seed) for figure in selected for seed in (args.seeds or figure.seeds)]
    started, cpu_started = time.perf_counter(), children_cpu_s()

    def one(job: tuple[Figure, int]) -> SeedRun:
        figure, seed = job
        if args.no_run:
            run = SeedRun(figure.name, seed, (args.workdir / figure.name / f"seed_{seed}").resolve())
        else:
            run = run_seed(figure, seed, args.workdir, repo, environment, args.native_kernels)
        run = read_values(figure, run)
        print(
            f"  {figure.name} seed {seed}: "
            + (f"FAILED: {run.error}" if run.error else ", ".join(f"{k} {v:.4g}" for k, v in run.values.items()))
            + (f" ({run.wall_s:.0f} s)" if not math.isnan(run.wall_s) else ""),
            flush=True,
        )
        return run

    print(f"learning_suite.py: {len(selected)} figures, {len(jobs)} seed runs -> {args.workdir}", flush=True)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        runs = list(pool.map(one, [job for job in jobs if not job[0].alone]))
    runs += [one(job) for job in jobs if job[0].alone]  # after the others, one at a time
    total, cpu = time.perf_counter() - started, children_cpu_s() - cpu_started
    rows, failed = [], []
    args.figures_dir.mkdir(parents=True, exist_ok=True)
    for figure in selected:
        figure_runs = [run for run in runs if run.figure == figure.name]
        figure_rows, record = check(figure, figure_runs)
        rows += figure_rows
        if not record["pass"]:
            failed.append(figure.name)
        (args.figures_dir / f"{figure.name}.json").write_text(json.dumps(record, indent=1) + "\n")
        if args.plot and figure.curves:
            from seed_curves import plot_figure

            plot_figure(figure, figure_runs, args.figures_dir / f"{figure.name}.png")
    print()
    print_table(rows)
    print(
        f"\n{len(selected) - len(failed)} of {len(selected)} figures hold on every seed"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
        + (
            " (the runs already in --workdir"
            if args.no_run
            else f" ({total / 60:.1f} min wall, {cpu / 60:.1f} min CPU of the runs"
        )
        + f"; records in {args.figures_dir})"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""What does the best-of-n difficulty filter buy and cost on the sort task?

Runs configs/sort_curriculum.yaml twice through `rlvr fit`, with the filter and without it
(`data.difficulty_filter: null`), same seed, same rollout steps, hence the same number of
policy updates (checked), threads pinned, CSV logging only. Prints for each run: greedy
exact-sort accuracy and mean reward on the 256 held-out prompts at the end, the training
reward of the last 10 steps (on the prompts each run trained on: the filtered run's are harder),
wall time, and the filter's estimation cost (seconds, completions sampled, refreshes, fallbacks).

    python scripts/bench_curriculum.py                      # window mode, 200 steps
    python scripts/bench_curriculum.py --mode fail_all --seeds 0 1 2
    python scripts/bench_curriculum.py --filter-arg pass_threshold=6.0
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlvr_lightning.cli.app import main as rlvr_cli  # noqa: E402

CONFIG = REPO / "configs" / "sort_curriculum.yaml"


def read_log(directory: Path) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    for path in sorted(directory.rglob("metrics.csv")):
        with open(path) as f:
            rows.extend(csv.DictReader(f))
    return rows


def column(rows, key) -> list[tuple[int, float]]:
    return [(int(r["step"]), float(r[key])) for r in rows if r.get(key) not in (None, "")]


def run(name: str, args, seed: int, with_filter: bool, workdir: Path) -> dict[str, float]:
    overrides = [
        f"--seed_everything={seed}",
        f"--trainer.max_epochs={args.steps // args.steps_per_epoch}",
        f"--trainer.limit_train_batches={args.steps_per_epoch}",
        f"--trainer.val_check_interval={args.steps_per_epoch * (args.steps // args.steps_per_epoch)}",
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
        f"--trainer.logger.save_dir={workdir}",
        f"--trainer.logger.name={name}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.enable_checkpointing=false",
    ]
    if with_filter:
        overrides.append(f"--data.init_args.difficulty_filter.init_args.mode={args.mode}")
        overrides += [f"--data.init_args.difficulty_filter.init_args.{kv}" for kv in args.filter_arg]
    else:
        overrides.append("--data.init_args.difficulty_filter=null")
    # the config's RolloutCheckpoint would write into runs/: drop it (checkpointing is off)
    callbacks = [
        "--trainer.callbacks=rlvr_lightning.rewards.SortInclusionOrderingReward",
        "--trainer.callbacks+=rlvr_lightning.advantages.GroupNormalizedAdvantage",
    ]
    started = time.perf_counter()
    cli = rlvr_cli(["fit", "--config", str(CONFIG), *callbacks, *overrides])
    wall = time.perf_counter() - started
    rows = read_log(workdir / name)
    train = column(rows, "train/reward_mean")
    result = {
        "val_accuracy": column(rows, "val/accuracy")[-1][1],
        "val_reward": column(rows, "val/reward_mean")[-1][1],
        "train_reward_last10": statistics.mean(v for _, v in train[-10:]),
        "wall_s": wall,
        "rollout_steps": float(cli.trainer.fit_loop.epoch_loop._batches_that_stepped),
        "updates": float(cli.trainer.global_step),
        "estimation_s": sum(v for _, v in column(rows, "curriculum/estimation_s")),
        "completions": sum(v for _, v in column(rows, "curriculum/completions")),
        "refreshes": float(len(column(rows, "curriculum/kept"))),
        "fallbacks": sum(v for _, v in column(rows, "curriculum/fallback")),
        "kept_fraction_mean": statistics.mean([v for _, v in column(rows, "curriculum/kept_fraction")] or [0.0]),
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200, help="rollout steps of each run")
    parser.add_argument("--steps-per-epoch", type=int, default=25, help="rollout steps between curriculum refreshes")
    parser.add_argument("--mode", default="window", choices=["window", "fail_all"])
    parser.add_argument("--filter-arg", action="append", default=[], help="extra DifficultyFilter init arg, KEY=VALUE")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="also write every run's numbers here, as JSON ({label: [one dict per seed]})",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("WANDB_MODE", "disabled")

    results: dict[str, list[dict[str, float]]] = {"no filter": [], "filter": []}
    with tempfile.TemporaryDirectory() as tmp:
        # warm-up (first-call costs of the CLI and Lightning), not reported
        warmup = argparse.Namespace(**{**vars(args), "steps": 2, "steps_per_epoch": 1})
        for with_filter in (False, True):
            run(f"warmup_{with_filter}", warmup, 0, with_filter, Path(tmp))
        for seed in args.seeds:
            for label, with_filter in (("no filter", False), ("filter", True)):
                name = f"{'filter' if with_filter else 'plain'}_{seed}"
                result = run(name, args, seed, with_filter, Path(tmp))
                results[label].append(result)
                print(f"seed {seed} {label:>9}: " + ", ".join(f"{k} {v:.4g}" for k, v in result.items()), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"seeds": args.seeds, **results}, indent=1) + "\n")
    plain, filtered = results["no filter"], results["filter"]
    assert [r["updates"] for r in plain] == [r["updates"] for r in filtered], "runs made different numbers of updates"

    def mean(runs, key):
        return statistics.mean(r[key] for r in runs)

    filter_desc = f"{args.mode}" + (f" ({', '.join(args.filter_arg)})" if args.filter_arg else "")
    print(
        f"\nsort task (configs/sort_curriculum.yaml), {args.steps} rollout steps = {int(plain[0]['updates'])} "
        f"policy updates, refresh every {args.steps_per_epoch} steps, filter {filter_desc}, seeds {args.seeds}"
    )
    print(
        f"{'':>10} {'val exact-sort':>15} {'val reward':>11} {'train reward':>13} {'wall s':>8} "
        f"{'estimation s':>13} {'completions':>12} {'fallbacks':>10} {'kept':>6}"
    )
    for label, runs in results.items():
        print(
            f"{label:>10} {100 * mean(runs, 'val_accuracy'):>14.1f}% {mean(runs, 'val_reward'):>11.3f} "
            f"{mean(runs, 'train_reward_last10'):>13.3f} {mean(runs, 'wall_s'):>8.1f} "
            f"{mean(runs, 'estimation_s'):>13.2f} {mean(runs, 'completions'):>12.0f} {mean(runs, 'fallbacks'):>10.1f} "
            f"{100 * mean(runs, 'kept_fraction_mean'):>5.1f}%"
        )


if __name__ == "__main__":
    main()

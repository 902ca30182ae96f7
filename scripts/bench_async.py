#!/usr/bin/env python
"""Asynchronous rollouts on SmolLM2: what the overlap buys (step time) and what one update of staleness
costs (learning per minute), `rollout_staleness` 0 against 1 on `configs/smollm2_arithmetic_single_stage.yaml`
(LoRA r=16, 4 problems x 8 samples x 32 new tokens, one update per step; validation, checkpoints and rollout
tables off).

  steps   `--steps` rollout steps per leg, the two legs alternating in order within each of `--rounds`
          rounds (same seed for both legs of a round), one torch thread (the asynchronous leg runs a second
          Python thread). Prints per leg the median over rounds of each round's median step time (steps
          after the first: the first is warm-up, or with staleness 1 only samples), its parts, the speed-up.
  curves  each leg trains for the same wall-clock budget with each of `--seeds`: `--minutes` (trainer.max_time;
          legs alternating), or with `--sync-steps K` the time the staleness-0 leg takes for K updates on this
          machine (it runs first; the staleness-1 leg gets its training time as max_time, so the updates no longer
          follow the machine's speed); then the trained policy decodes `--num` held-out problems greedily
          (scored by the recipe's boxed accuracy and its last-number accuracy). Writes OUT/<leg>_seed<s>.json
          per run (reruns skip finished runs), OUT/results.json, the curves of the training reward and
          last-number accuracy (T = 1) against minutes to OUT/curves.png, and prints a table.

    rlvr-models fetch smollm2-135m-instruct      # once
    python scripts/bench_async.py steps --rounds 3 --steps 6
    python scripts/bench_async.py curves --seeds 0 1 2 --minutes 12 --out runs/bench_async
    python scripts/bench_async.py curves --seeds 0 1 2 --sync-steps 24 --out runs/bench_async_steps
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")

import yaml  # noqa: E402
from lightning.pytorch import Callback  # noqa: E402

from rlvr_lightning.runtime.timing import clock  # noqa: E402  (waits for the device's queued work before reading the time)

REPO = Path(__file__).resolve().parents[1]
LEGS = {0: "staleness0", 1: "staleness1"}
# what the plot and table show: the reward, and the rate of responses whose last number is the sum (the
# boxed accuracy of the recipe stays near 0 for the first ~40 steps: boxing is learned later)
CURVES = ("train/reward_mean", "train/rewards/last_number_accuracy", "train/rewards/math_accuracy")
PARTS = ("time/generation_s", "time/update_s", "time/rollout_wait_s", "time/weight_push_s")


def leg_config(base: Path, out: Path, name: str, staleness: int, seed: int, trainer: dict) -> Path:
    """The recipe with `rollout_staleness`, a seed, a CSV log of every step, and no validation or checkpoints."""
    config = yaml.safe_load(base.read_text())
    config["seed_everything"] = seed
    config["model"]["init_args"]["rollout_staleness"] = staleness
    policy = config["model"]["init_args"]["policy"]
    if policy["class_path"].endswith("policy_from_checkpoint"):  # the recipe starts from its warm-up's checkpoint
        checkpoint = Path(policy["init_args"]["checkpoint_path"]).resolve()
        if not checkpoint.is_file():
            raise SystemExit(
                f"{base} starts from {checkpoint}, which does not exist: run its warm-up stage first "
                "(scripts/train_smollm2_arithmetic.sh writes it under RUN_DIR/checkpoints/warmup)"
            )
        policy["init_args"]["checkpoint_path"] = str(checkpoint)
    options = config["trainer"]
    options["callbacks"] = [
        cb for cb in options["callbacks"] if not cb["class_path"].endswith(("ModelCheckpoint", "RolloutTableLogger"))
    ]
    options.update(
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger={
            "class_path": "lightning.pytorch.loggers.CSVLogger",
            "init_args": {"save_dir": str(out), "name": name, "version": 0, "flush_logs_every_n_steps": 1},
        },
    )
    options.update(trainer)
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class StepClock(Callback):
    """Wall and process CPU seconds (every thread: the background sampler's too) of each training step, and the
    training time at the last step's end as Lightning's `Timer` reads it for `max_time` (`time.monotonic` from
    `on_train_start`)."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.train_elapsed = 0.0

    def on_train_start(self, trainer, pl_module) -> None:
        self._train_started = time.monotonic()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._started = (clock(pl_module.device), time.process_time())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.wall.append(clock(pl_module.device) - self._started[0])
        self.cpu.append(time.process_time() - self._started[1])
        self.train_elapsed = time.monotonic() - self._train_started


def fit(config: Path):
    """`rlvr fit --config config` in this process; returns the CLI and the steps' `StepClock`."""
    from rlvr_lightning.cli.app import main

    cli = main(["fit", "--config", str(config), "--trainer.callbacks+=bench_async.StepClock"])
    return cli, next(cb for cb in cli.trainer.callbacks if type(cb).__name__ == "StepClock")


def step_rows(out: Path, name: str) -> list[dict[str, float]]:
    """One dict per logged training step (`step` and the numeric metrics)."""
    with open(out / name / "version_0" / "metrics.csv", newline="") as handle:
        rows = [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(handle)]
    return [row for row in rows if "time/step_s" in row]


# ------------------------------------------------------------------ steps


def cmd_steps(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    medians: dict[int, list[dict[str, float]]] = {0: [], 1: []}
    for round_index in range(args.rounds):
        for staleness in (0, 1) if round_index % 2 == 0 else (1, 0):
            name = f"steps_{LEGS[staleness]}_round{round_index}"
            load = os.getloadavg()[0]
            _, clock = fit(
                leg_config(
                    Path(args.config),
                    out,
                    name,
                    staleness,
                    round_index,
                    {"max_time": None, "limit_train_batches": args.steps},
                )
            )
            rows = [row for row in step_rows(out, name) if row["step"] >= 1]
            median = {key: statistics.median(row.get(key, 0.0) for row in rows) for key in ("time/step_s", *PARTS)}
            median["cpu_s"] = statistics.median(clock.cpu[1:])
            median["cores"] = statistics.median(
                cpu / wall for cpu, wall in zip(clock.cpu[1:], clock.wall[1:], strict=True)
            )
            medians[staleness].append(median)
            print(
                f"round {round_index} {LEGS[staleness]}: median step {median['time/step_s']:.2f} s "
                f"over steps 1-{args.steps - 1}, "
                f"CPU {median['cpu_s']:.2f} s ({median['cores']:.2f} cores; load average {load:.1f} before)",
                flush=True,
            )
    summary = {LEGS[s]: {key: statistics.median(m[key] for m in medians[s]) for key in medians[s][0]} for s in (0, 1)}
    summary["rounds"] = {LEGS[s]: [round(m["time/step_s"], 2) for m in medians[s]] for s in (0, 1)}
    print("\nleg          step s  CPU s  cores  generation s  update s  wait s  push s  (step s per round)")
    for staleness in (0, 1):
        m = summary[LEGS[staleness]]
        print(
            f"{LEGS[staleness]}  {m['time/step_s']:6.2f}  {m['cpu_s']:5.2f}  {m['cores']:5.2f}  "
            f"{m['time/generation_s']:12.2f}  {m['time/update_s']:8.2f}  {m['time/rollout_wait_s']:6.2f}  "
            f"{m['time/weight_push_s']:6.3f}  {summary['rounds'][LEGS[staleness]]}"
        )
    speedup = summary[LEGS[0]]["time/step_s"] / summary[LEGS[1]]["time/step_s"]
    print(f"speed-up of staleness 1: {speedup:.2f}x (medians of {args.rounds} rounds)")
    (out / "steps.json").write_text(json.dumps({**summary, "speedup": speedup}, indent=2) + "\n")


# ------------------------------------------------------------------ curves


def heldout_accuracy(cli, num: int) -> tuple[dict[str, float], float]:
    """Greedy decoding of the run's first `num` held-out problems by its trained policy: the rate each task reward
    of the run (the boxed answer, and the last number) calls correct; and the seconds it took. The task, rewards
    and sampling options are the ones the run built (`rlvr eval` reports the first task reward's accuracy only)."""
    import dataclasses

    import torch

    from rlvr_lightning.data.task import collate_examples

    started = time.perf_counter()
    policy, task = cli.model.policy, cli.datamodule.task
    rewards = [reward for reward in cli.model.reward_callbacks if reward.kind == "task"]
    examples = (task.val_examples() if hasattr(task, "val_examples") else list(task.val_dataset()))[:num]
    sampling = dataclasses.replace(cli.model.sampling, do_sample=False)
    correct = {reward.name: 0 for reward in rewards}
    with torch.no_grad():
        for start in range(0, len(examples), 50):
            rollout = policy.sample(collate_examples(examples[start : start + 50]), 1, sampling)
            for reward in rewards:
                correct[reward.name] += int(reward.is_correct(rollout, reward(rollout)).sum())
    for reward in rewards:
        getattr(reward, "close", lambda: None)()
    return {name: count / len(examples) for name, count in correct.items()}, time.perf_counter() - started


def leg_order(index: int, sync_steps: int | None) -> tuple[int, int]:
    """The stalenesses of a seed's legs in the order they run: alternating between seeds under a wall-clock budget
    (neither leg always meets the machine first), staleness 0 first when its run sets the budget."""
    return (0, 1) if sync_steps or index % 2 == 0 else (1, 0)


def leg_budget(args, out: Path, staleness: int, seed: int) -> dict:
    """The trainer options that bound a leg: `--minutes` of max_time; with `--sync-steps K`, K updates for staleness
    0 and its measured training time (`train_elapsed_s`, whole seconds up) as max_time for staleness 1. Lightning
    stops a leg at the first step end past its max_time, so staleness 1 may run into one step more than the time."""
    if not args.sync_steps:
        return {"max_time": time.strftime("00:%H:%M:%S", time.gmtime(args.minutes * 60))}
    if staleness == 0:
        return {"max_time": None, "max_steps": args.sync_steps}
    synchronous = json.loads((out / f"{LEGS[0]}_seed{seed}.json").read_text())
    return {"max_time": {"seconds": math.ceil(synchronous["train_elapsed_s"])}}


def cmd_curves(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for index, seed in enumerate(args.seeds):
        for staleness in leg_order(index, args.sync_steps):
            name = f"{LEGS[staleness]}_seed{seed}"
            if (out / f"{name}.json").exists():
                continue
            budget = leg_budget(args, out, staleness, seed)
            config = leg_config(Path(args.config), out, name, staleness, seed, budget)
            started, load = time.perf_counter(), os.getloadavg()[0]
            cli, clock = fit(config)
            wall = time.perf_counter() - started
            rows = step_rows(out, name)
            heldout, eval_seconds = heldout_accuracy(cli, args.num)
            last10 = {key: [row[key] for row in rows if key in row][-10:] for key in CURVES}
            result = {
                "leg": LEGS[staleness],
                "seed": seed,
                "budget": budget,
                "steps": len(rows),
                "updates": cli.trainer.global_step,
                "fit_wall_s": round(wall, 1),
                "train_elapsed_s": round(clock.train_elapsed, 1),
                "train_minutes": round(sum(row["time/step_s"] for row in rows) / 60, 2),
                **{f"{key}_last10": round(statistics.mean(values), 4) for key, values in last10.items()},
                **{f"heldout_greedy/{name}": rate for name, rate in heldout.items()},
                "heldout_problems": args.num,
                "eval_s": round(eval_seconds, 1),
                "median_step_s": round(statistics.median(row["time/step_s"] for row in rows[1:]), 2),
                "median_step_cpu_s": round(statistics.median(clock.cpu[1:]), 2),
                "load_average_before": round(load, 2),
            }
            (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
            print(json.dumps(result), flush=True)
    results = [json.loads((out / f"{LEGS[s]}_seed{seed}.json").read_text()) for s in (0, 1) for seed in args.seeds]
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    table(results)
    budget_s = max(result["train_elapsed_s"] for result in results) if args.sync_steps else args.minutes * 60
    plot(out, args.seeds, budget_s / 60)


def table(results: list[dict]) -> None:
    def mean_std(values, percent=True):
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        return (
            f"{statistics.mean(values):.1%} ± {spread:.1%}"
            if percent
            else f"{statistics.mean(values):.3f} ± {spread:.3f}"
        )

    print(
        "\n| leg | updates in the budget | median step s | train reward, last 10 steps "
        "| train last-number accuracy, last 10 | held-out greedy: last number "
        "| held-out greedy: boxed (the recipe's accuracy) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for leg in LEGS.values():
        runs = [r for r in results if r["leg"] == leg]
        print(
            f"| {leg} | {' / '.join(str(r['updates']) for r in runs)} "
            f"| {statistics.median(r['median_step_s'] for r in runs):.2f} | "
            f"{mean_std([r['train/reward_mean_last10'] for r in runs], percent=False)} | "
            f"{mean_std([r['train/rewards/last_number_accuracy_last10'] for r in runs])} | "
            f"{mean_std([r['heldout_greedy/last_number_accuracy'] for r in runs])} | "
            f"{mean_std([r['heldout_greedy/math_accuracy'] for r in runs])} |"
        )


def plot(out: Path, seeds: list[int], minutes: float, window: int = 10) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, label in zip(
        axes,
        CURVES[:2],
        ("train reward (accuracy + 0.5 last number + 0.05 boxed)", "train last-number accuracy"),
        strict=True,
    ):
        for staleness, color in ((0, "tab:blue"), (1, "tab:red")):
            for seed in seeds:
                elapsed, xs, ys = 0.0, [], []
                for row in step_rows(out, f"{LEGS[staleness]}_seed{seed}"):
                    elapsed += row["time/step_s"]
                    if key in row:
                        xs.append(elapsed / 60)
                        ys.append(row[key])
                smooth = [statistics.mean(ys[max(0, i - window + 1) : i + 1]) for i in range(len(ys))]
                ax.plot(
                    xs,
                    smooth,
                    color=color,
                    alpha=0.8,
                    label=f"rollout_staleness {staleness}" if seed == seeds[0] else None,
                )
        ax.set_xlabel("minutes of training steps (sum of time/step_s)")
        ax.set_ylabel(f"{label}, mean of {window} steps", fontsize=8)
        ax.set_xlim(0, minutes)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"SmolLM2-135M GRPO on 2-digit addition, 2 shared CPU cores, seeds {', '.join(map(str, seeds))}", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)
    print(f"wrote {out / 'curves.png'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    steps = sub.add_parser("steps", help="step time of rollout_staleness 0 and 1, interleaved rounds")
    steps.add_argument("--rounds", type=int, default=3)
    steps.add_argument("--steps", type=int, default=6, help="rollout steps per leg and round (the first is not timed)")
    steps.add_argument("--out", default="runs/bench_async")
    steps.set_defaults(fn=cmd_steps)
    curves = sub.add_parser("curves", help="learning of both legs in the same wall-clock budget")
    curves.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    budget = curves.add_mutually_exclusive_group()
    budget.add_argument("--minutes", type=float, default=12.0, help="trainer.max_time of every run")
    budget.add_argument(
        "--sync-steps",
        type=int,
        default=None,
        help="budget each seed by the time its staleness-0 leg takes for this many updates (instead of --minutes)",
    )
    curves.add_argument("--num", type=int, default=200, help="held-out problems decoded greedily after training")
    curves.add_argument("--out", default="runs/bench_async")
    curves.set_defaults(fn=cmd_curves)
    for command in (steps, curves):
        command.add_argument("--config", default=str(REPO / "configs" / "smollm2_arithmetic_single_stage.yaml"))
    args = parser.parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Bounded staleness, `rollout_staleness` K = 0 against K = 2, with the off-policy correction K >= 1 requires
(`rollout_is` token_mask: AReaL's decoupled loss, tokens whose weight leaves [0, 2] drop out).

  toy      the sort task of `configs/sort_grpo.yaml` (the toy policy, which samples in-process: no engine),
           `--steps` rollout steps per leg and seed, all runs in this process, validation and checkpoints
           off. Writes OUT/<leg>_seed<s>/version_0/metrics.csv, OUT/results.json, the training reward of
           every run against its step to OUT/staleness_curves.png (or `--png`), and prints a Markdown table:
           per seed and leg the mean reward of the last 10 steps and the staleness logged in the steady state.
  smollm2  a few steps of `configs/smollm2_demo.yaml` with K = 2 and the rollouts from vLLM servers
           (`--servers host:port ...`, started before with `rlvr serve`); prints each step's time and
           `train/async/staleness`.

    python scripts/staleness_curves.py toy --seeds 0 1 2 --steps 60 --out runs/staleness --png docs/staleness_curves.png
    rlvr serve --model smollm2-135m-instruct --port 8000 \
        -- --max-model-len 1024 --enforce-eager --kv-cache-memory-bytes 268435456
    python scripts/staleness_curves.py smollm2 --servers localhost:8000 --steps 5 --out runs/staleness_smollm2
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import yaml  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LEGS = (0, 2)
LAST = 10  # steps averaged for the final reward


def leg_config(base: Path, out: Path, name: str, staleness: int, seed: int, steps: int, generation=None) -> Path:
    """`base` with `rollout_staleness`, a seed, `steps` rollout steps, a CSV log of every step; no validation,
    no checkpoints."""
    config = yaml.safe_load(base.read_text())
    config["seed_everything"] = seed
    module = config["model"]["init_args"]
    module["rollout_staleness"] = staleness
    if staleness:
        module["rollout_is"] = {"mode": "token_mask"}
    if generation is not None:
        module["policy"]["init_args"].setdefault("generation", {})["backend"] = generation
    trainer = config["trainer"]
    trainer["callbacks"] = [cb for cb in trainer["callbacks"] if not cb["class_path"].endswith("Checkpoint")]
    trainer.update(
        limit_train_batches=steps,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        val_check_interval=None,
        check_val_every_n_epoch=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        logger={
            "class_path": "lightning.pytorch.loggers.CSVLogger",
            "init_args": {"save_dir": str(out), "name": name, "version": 0, "flush_logs_every_n_steps": 1},
        },
    )
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def step_rows(out: Path, name: str) -> list[dict[str, float]]:
    with open(out / name / "version_0" / "metrics.csv", newline="") as handle:
        rows = [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(handle)]
    return [row for row in rows if "train/reward_mean" in row or "train/async/queued" in row]


def fit(config: Path) -> None:
    from rlvr_lightning.cli.app import main

    main(["fit", "--config", str(config)])


def cmd_toy(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for seed in args.seeds:
        for staleness in LEGS:
            name = f"k{staleness}_seed{seed}"
            if not (out / name / "version_0" / "metrics.csv").exists() or args.rerun:
                fit(leg_config(REPO / "configs" / "sort_grpo.yaml", out, name, staleness, seed, args.steps))
            rows = [row for row in step_rows(out, name) if "train/reward_mean" in row]
            stale = [row["train/async/staleness"] for row in rows[-LAST:] if "train/async/staleness" in row]
            results[name] = {
                "staleness": staleness,
                "seed": seed,
                "steps": [int(row["step"]) for row in rows],
                "reward": [row["train/reward_mean"] for row in rows],
                "final_reward": statistics.fmean(row["train/reward_mean"] for row in rows[-LAST:]),
                "steady_staleness": statistics.fmean(stale) if stale else 0.0,
            }
            print(f"{name}: final reward {results[name]['final_reward']:.3f}", flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    plot(results, Path(args.png or out / "staleness_curves.png"), args.steps)
    print(f"\n{datetime.date.today()}: {' '.join(sys.argv)}\n")
    print("| seed | " + " | ".join(f"K = {k}: final reward (staleness logged)" for k in LEGS) + " |")
    print("|---|" + "---|" * len(LEGS))
    for seed in args.seeds:
        cells = [results[f"k{k}_seed{seed}"] for k in LEGS]
        print(f"| {seed} | " + " | ".join(f"{c['final_reward']:.3f} ({c['steady_staleness']:g})" for c in cells) + " |")


def plot(results: dict, path: Path, steps: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.5, 4))
    colours = {0: "tab:blue", 2: "tab:orange"}
    for run in results.values():
        k = run["staleness"]
        label = f"K = {k}" if run["seed"] == min(r["seed"] for r in results.values()) else None
        axes.plot(run["steps"], run["reward"], color=colours[k], alpha=0.8, linewidth=1.2, label=label)
    axes.set(xlabel="rollout step", ylabel="training reward (mean)", xlim=(0, steps))
    axes.set_title(f"sort task, rollout_staleness K = 0 vs K = 2 (token_mask), {len(results) // 2} seeds")
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    print(f"wrote {path}")


def cmd_smollm2(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    generation = {"class_path": "rlvr_lightning.generation.ServerGeneration", "init_args": {"servers": args.servers}}
    name = "smollm2_k2"
    fit(leg_config(REPO / "configs" / "smollm2_demo.yaml", out, name, 2, 0, args.steps, generation))
    print(f"\n{datetime.date.today()}: {' '.join(sys.argv)}\n")
    print(
        "| step | staleness | queued | step s | generation s | update s | wait s | weight push s | reward | "
        "sampler/trainer log-prob max diff |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    keys = ("train/async/staleness", "train/async/queued", "time/step_s", "time/generation_s", "time/update_s")
    keys += ("time/rollout_wait_s", "time/weight_push_s", "train/reward_mean", "train/mismatch/abs_diff_max")
    for row in step_rows(out, name):
        cells = [f"{row[key]:.2f}" if key in row else "-" for key in keys[:-1]]
        cells.append(f"{row[keys[-1]]:.2g}" if keys[-1] in row else "-")
        print(f"| {int(row['step'])} | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    toy = commands.add_parser("toy")
    toy.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    toy.add_argument("--steps", type=int, default=60)
    toy.add_argument("--out", default="runs/staleness")
    toy.add_argument("--png", default=None)
    toy.add_argument("--rerun", action="store_true", help="run again the legs whose log exists")
    toy.set_defaults(run=cmd_toy)
    smollm2 = commands.add_parser("smollm2")
    smollm2.add_argument("--servers", nargs="+", required=True)
    smollm2.add_argument("--steps", type=int, default=5)
    smollm2.add_argument("--out", default="runs/staleness_smollm2")
    smollm2.set_defaults(run=cmd_smollm2)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()

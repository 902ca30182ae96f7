#!/usr/bin/env python
"""An R1-style pipeline on the sort task: SFT cold start, then GRPO, or expert iteration, from it.

    python scripts/sft_then_grpo.py                  # all stages, about a minute or two on a laptop CPU
    python scripts/sft_then_grpo.py --stages data    # only write the SFT pairs (runs/sft_sort/train.jsonl)

Stages (each reports the greedy exact-sort accuracy on the sort task's 256 held-out prompts):

    data         `--num_examples` correct pairs "prompt -> prompt sorted" from the training stream
                 (never a validation prompt) -> WORKDIR/train.jsonl
    sft          configs/recipes/sft.yaml (SFTModule) on them -> a Lightning checkpoint
    grpo         configs/recipes/grpo.yaml with its policy loaded from the SFT checkpoint
                 (rlvr_lightning.modules.policy_from_checkpoint; the KL reference is the SFT policy)
    grpo_scratch the same GRPO recipe from a random policy (the control)
    ei           configs/recipes/expert_iteration.yaml (ExpertIterationModule) from the SFT checkpoint
                 for `--ei_rounds` rounds, keeping only exact sorts (the task reward's is_correct)

Every stage goes through the `rlvr` LightningCLI (`stage_cli`), with a CSV logger under WORKDIR/logs.
A summary table is printed and written to WORKDIR/pipeline.md.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGES = ("data", "sft", "grpo", "grpo_scratch", "ei")
# The SFT and expert-iteration stage configs. They live beside this script until `rlvr` accepts every
# LightningModule by class_path; then they belong in configs/recipes (and `stage_cli` is `cli.main`).
SFT_CONFIG = REPO / "configs" / "recipes" / "sft.yaml"
EI_CONFIG = REPO / "configs" / "recipes" / "expert_iteration.yaml"


def stage_cli(args: list[str]):
    """`rlvr ARGS`, in-process."""
    from rlvr_lightning.cli.app import main

    return main(args)


def sort_pairs(num_examples: int, vocab_size: int = 10, length: int = 4, seed: int = 0) -> list[dict]:
    """Correct SFT pairs from the sort task's training stream (validation prompts are never drawn)."""
    from rlvr_lightning.data import SortTask

    task = SortTask(vocab_size=vocab_size, length=length, seed=seed)
    stream = iter(task.train_dataset())
    return [{"prompt": e["prompt"], "response": e["answer"]} for e in itertools.islice(stream, num_examples)]


def recipe_policy(recipe: Path) -> dict:
    """The `model.init_args.policy` block of a recipe (so the checkpoint is loaded into the same architecture)."""
    import yaml

    config = yaml.safe_load(recipe.read_text())
    return config["model"]["init_args"]["policy"]


def from_checkpoint(policy: dict, checkpoint: Path) -> str:
    """A `--model.init_args.policy=` value that loads `checkpoint` into `policy`."""
    wrapped = {
        "class_path": "rlvr_lightning.modules.policy_from_checkpoint",
        "init_args": {"checkpoint_path": str(checkpoint), "policy": policy},
    }
    return "--model.init_args.policy=" + json.dumps(wrapped)


def common_args(workdir: Path, stage: str, seed: int) -> list[str]:
    logger = {
        "class_path": "lightning.pytorch.loggers.CSVLogger",
        "init_args": {"save_dir": str(workdir / "logs"), "name": stage, "version": f"seed_{seed}"},
    }
    return [
        f"--seed_everything={seed}",
        f"--trainer.logger={json.dumps(logger)}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={workdir / 'logs' / stage}",
    ]


def validation_curve(workdir: Path, stage: str, seed: int) -> list[tuple[int, float]]:
    """(rollout or optimizer step, val/accuracy) of every validation a stage logged."""
    path = workdir / "logs" / stage / f"seed_{seed}" / "metrics.csv"
    with path.open(newline="") as handle:
        return [
            (int(float(r["step"])) + 1, float(r["val/accuracy"]))
            for r in csv.DictReader(handle)
            if r.get("val/accuracy")
        ]


def run_stage(name: str, args: list[str], workdir: Path, seed: int) -> dict:
    import torch

    torch.set_num_threads(1)
    started = time.perf_counter()
    cli = stage_cli(["fit", *args, *common_args(workdir, name, seed)])
    seconds = time.perf_counter() - started
    curve = validation_curve(workdir, name, seed)
    result = {
        "stage": name,
        "seconds": seconds,
        "val_accuracy": curve[-1][1] if curve else float("nan"),
        "curve": curve,
    }
    checkpoint = getattr(cli.trainer.checkpoint_callback, "last_model_path", "") or getattr(
        cli.trainer.checkpoint_callback, "best_model_path", ""
    )
    if checkpoint:
        result["checkpoint"] = checkpoint
    print(f"[{name}] val accuracy {result['val_accuracy']:.3f} after {seconds:.0f} s; validations {curve}", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES))
    parser.add_argument("--workdir", type=Path, default=REPO / "runs" / "sft_sort")
    parser.add_argument("--num_examples", type=int, default=300, help="SFT pairs (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sft_config", type=Path, default=SFT_CONFIG)
    parser.add_argument("--grpo_recipe", type=Path, default=REPO / "configs" / "recipes" / "grpo.yaml")
    parser.add_argument("--grpo_steps", type=int, default=None, help="default: the recipe's limit_train_batches")
    parser.add_argument("--ei_config", type=Path, default=EI_CONFIG)
    parser.add_argument("--ei_rounds", type=int, default=3)
    parser.add_argument(
        "--sft_checkpoint", type=Path, default=None, help="skip `sft` and start later stages from this checkpoint"
    )
    args, extra = parser.parse_known_args(argv)  # anything else goes to every training stage
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    train_file = workdir / "train.jsonl"
    results: list[dict] = []

    if "data" in args.stages:
        from rlvr_lightning.data.sft_data import write_jsonl

        write_jsonl(sort_pairs(args.num_examples, seed=args.seed), train_file)
        print(f"[data] {args.num_examples} sort pairs -> {train_file}", flush=True)

    checkpoint = args.sft_checkpoint
    if "sft" in args.stages:
        result = run_stage(
            "sft",
            ["--config", str(args.sft_config), f"--data.init_args.train_file={train_file}", *extra],
            workdir,
            args.seed,
        )
        results.append(result)
        checkpoint = Path(result["checkpoint"])
    later = [s for s in ("grpo", "ei") if s in args.stages]
    if later and checkpoint is None:
        default = workdir / "sft.ckpt"
        checkpoint = default if default.is_file() else None
        if checkpoint is None:
            parser.error(f"stages {later} start from the SFT checkpoint: run the sft stage or pass --sft_checkpoint")

    steps = [f"--trainer.limit_train_batches={args.grpo_steps}"] if args.grpo_steps else []
    if "grpo" in args.stages:
        policy = from_checkpoint(recipe_policy(args.grpo_recipe), checkpoint)
        results.append(
            run_stage("grpo", ["--config", str(args.grpo_recipe), policy, *steps, *extra], workdir, args.seed)
        )
    if "grpo_scratch" in args.stages:
        results.append(
            run_stage("grpo_scratch", ["--config", str(args.grpo_recipe), *steps, *extra], workdir, args.seed)
        )
    if "ei" in args.stages:
        policy = from_checkpoint(recipe_policy(args.ei_config), checkpoint)
        ei_args = [
            "--config",
            str(args.ei_config),
            policy,
            "--model.init_args.reward_threshold=null",  # keep exact sorts only
            f"--trainer.limit_train_batches={args.ei_rounds}",
            "--trainer.val_check_interval=1",
            "--trainer.enable_checkpointing=false",
            *extra,
        ]
        results.append(run_stage("ei", ei_args, workdir, args.seed))

    if results:
        lines = [
            "| stage | starts from | val exact-sort accuracy | validations (step: accuracy) | wall time |",
            "| --- | --- | ---: | --- | ---: |",
        ]
        origin = {"sft": "random init", "grpo": "SFT checkpoint", "grpo_scratch": "random init", "ei": "SFT checkpoint"}
        for r in results:
            curve = ", ".join(f"{step}: {acc:.1%}" for step, acc in r["curve"])
            lines.append(
                f"| {r['stage']} | {origin[r['stage']]} | {r['val_accuracy']:.1%} | {curve} | {r['seconds']:.0f} s |"
            )
        table = "\n".join(lines)
        (workdir / "pipeline.md").write_text(table + "\n")
        (workdir / "pipeline.json").write_text(json.dumps(results, indent=1))
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

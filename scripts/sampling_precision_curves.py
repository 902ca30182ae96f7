#!/usr/bin/env python
"""Does sampling in bf16 hurt learning? Reward curves of fp32 and bf16 sampling (fp32 master weights and update in
both) on the tiny-Llama "repeat the named digit" task of `rlvr_lightning/demos/named_digit.py`, over seeds.

Both legs run GRPO through `rlvr fit` with `rollout_is: token_truncate` (an fp32 sampler's weights are ~1); the
bf16 leg samples with `KVCacheGeneration(dtype: bfloat16)`. Legs alternate per seed (fp32, bf16, fp32, ...), one
torch thread. Prints per leg the mean reward of the first step and of the last 5, mean and spread over seeds,
the held-out greedy accuracy at the end, and the mismatch the bf16 sampler logged (k3 KL, IS weight max).

    python scripts/sampling_precision_curves.py --seeds 0 1 2 --steps 40 --json curves.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import lightning.pytorch as pl
import torch

from rlvr_lightning.demos.named_digit import fit, fit_config, greedy_accuracy, mean, save_word_tokenizer

LEGS = {
    "fp32": "float32",
    "bf16": "bfloat16",
}
MISMATCH = ("train/mismatch/k3_kl", "train/mismatch/is_weight_max")


class MismatchLog(pl.Callback):
    """The mismatch metrics of every step."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, *args) -> None:
        metrics = trainer.callback_metrics
        self.rows.append({key: float(metrics[key]) for key in MISMATCH if key in metrics})


def run(tokenizer_dir: Path, seed: int, dtype: str, steps: int, directory: Path) -> dict:
    generation = {"class_path": "rlvr_lightning.generation.KVCacheGeneration", "init_args": {"dtype": dtype}}
    config = fit_config(
        tokenizer_dir,
        seed,
        steps=steps,
        module={"rollout_is": {"mode": "token_truncate"}},
        policy={"generation": {"backend": generation}},
    )
    config["trainer"]["callbacks"].append({"class_path": f"{__name__}.MismatchLog"})
    cli, curve = fit(config, directory)
    log = next(cb for cb in cli.trainer.callbacks if isinstance(cb, MismatchLog))
    return {
        "rewards": curve.rewards,
        "accuracy": greedy_accuracy(cli.model.policy),
        "k3_kl": [row.get(MISMATCH[0], float("nan")) for row in log.rows],
        "is_weight_max": [row.get(MISMATCH[1], float("nan")) for row in log.rows],
    }


def spread(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results: dict[str, list[dict]] = {leg: [] for leg in LEGS}
    with tempfile.TemporaryDirectory(prefix="precision-curves-") as tmp:
        tokenizer_dir = save_word_tokenizer(Path(tmp) / "tokenizer")
        for seed in args.seeds:
            for leg, dtype in LEGS.items():
                directory = Path(tmp) / f"{leg}-{seed}"
                directory.mkdir()
                out = run(tokenizer_dir, seed, dtype, args.steps, directory)
                results[leg].append(out)
                print(f"seed {seed} {leg}: rewards {[round(r, 2) for r in out['rewards']]}", flush=True)
    print(f"\n{len(args.seeds)} seeds x {args.steps} steps; mean [min-max] over seeds")
    print(f"{'leg':<5} {'first step':>22} {'last 5 steps':>22} {'greedy acc.':>22} {'k3 KL':>10} {'IS max':>8}")
    for leg, runs in results.items():
        k3 = statistics.median(v for r in runs for v in r["k3_kl"])
        is_max = max(v for r in runs for v in r["is_weight_max"])
        first, last = spread([r["rewards"][0] for r in runs]), spread([mean(r["rewards"][-5:]) for r in runs])
        accuracy = spread([r["accuracy"] for r in runs])
        print(f"{leg:<5} {first:>22} {last:>22} {accuracy:>22} {k3:10.2e} {is_max:8.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

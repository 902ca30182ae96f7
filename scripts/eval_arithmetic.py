r"""Evaluate a policy on the held-out problems of a recipe's task, and plot a run's training curve.

    # accuracy and format rate on the 200 held-out problems, sampled at temperature 1.0 and greedily
    python scripts/eval_arithmetic.py eval --config configs/smollm2_arithmetic.yaml
    python scripts/eval_arithmetic.py eval --config configs/smollm2_arithmetic.yaml \
        --ckpt /tmp/run/csv/checkpoints/final.ckpt
    # a tool-use recipe: tool use rate and calls are reported too; --no-tools takes the tools away
    python scripts/eval_arithmetic.py eval --config configs/smollm2_calculator.yaml --num 100 --no-tools
    # options after `--` go to `rlvr eval` as they are (here: the problems of a run trained on another task)
    python scripts/eval_arithmetic.py eval --config configs/smollm2_rlcr.yaml \
        --ckpt /tmp/run/csv/checkpoints/final.ckpt \
        -- --data.init_args.task.init_args.min_digits 1 --data.init_args.task.init_args.digits 3

    # the curve of a run (its CSV log) as a PNG
    python scripts/eval_arithmetic.py plot --csv /tmp/run/csv/version_0/metrics.csv --out runs/smollm2_arithmetic.png

(`/tmp/run` as in `scripts/train_smollm2_arithmetic.sh /tmp/run`, which logs to RUN_DIR/csv/version_0/ and puts
the checkpoints, last.ckpt and final.ckpt, in RUN_DIR/csv/checkpoints/.)

`eval` runs `rlvr eval` once per decoding mode on the recipe (so prompts, rewards, answer extraction and
format check are the recipe's) with the policy weights of a Lightning checkpoint (`--ckpt`) or untrained; a
recipe whose policy starts from an earlier stage's checkpoint is evaluated from its inner policy (untrained
without `--ckpt`: pass that stage's checkpoint to evaluate it). It reports `rlvr eval`'s JSON per mode (accuracy
from the first `kind: task` reward, format rate from the first `kind: format` reward, pass@k and maj@k when
`--samples` > 1, mean response length; a tool-use recipe's `generation` statistics: `tool_use_rate`,
`tool_calls/mean`, ...) plus wall time.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import yaml  # noqa: E402


def policy_spec(config_path: str, no_tools: bool) -> dict:
    """The recipe's policy, for `--model.init_args.policy`: the inner policy of a recipe whose policy starts
    from an earlier stage's checkpoint (its weights come from --ckpt, or it is evaluated untrained), without its
    tools with `no_tools` (the control of a tool-use recipe)."""
    spec = yaml.safe_load(Path(config_path).read_text())["model"]["init_args"]["policy"]
    if spec["class_path"].endswith("policy_from_checkpoint"):
        spec = spec["init_args"]["policy"]
    if no_tools:
        init_args = spec.get("init_args", {})
        generation = {**(init_args.get("generation") or {}), "tools": None}  # null replaces, absent merges
        spec = {**spec, "init_args": {**init_args, "generation": generation}}
    return spec


def eval_args(args, mode: str, output: Path, root: str) -> list[str]:
    """The `rlvr eval` command line of one decoding mode: the first `--num` held-out problems in batches of at most
    `--batch-size`."""
    batch = max(size for size in range(1, min(args.batch_size, args.num) + 1) if args.num % size == 0)
    argv = [
        "eval", "--config", args.config, "--torch_threads", str(args.threads), "--seed_everything", str(args.seed),
        "--model.init_args.policy", json.dumps(policy_spec(args.config, args.no_tools)),
        "--data.init_args.val_batch_size", str(batch), "--trainer.limit_val_batches", str(args.num // batch),
        "--trainer.logger", "false", "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", root,
        "--eval.output", str(output),
    ]  # fmt: skip
    if args.ckpt:
        argv += ["--ckpt_path", args.ckpt]
    argv += args.overrides
    if args.max_new_tokens:
        argv += ["--model.init_args.sampling.max_new_tokens", str(args.max_new_tokens)]
    if mode == "greedy":
        return argv + ["--eval.greedy", "true", "--eval.samples", "1"]
    return argv + [
        "--eval.greedy",
        "false",
        "--eval.samples",
        str(args.samples),
        "--eval.temperature",
        str(args.temperature),
    ]


def cmd_eval(args) -> None:
    from rlvr_lightning.cli.app import entry_point

    started = time.perf_counter()
    report: dict = {"config": args.config, "ckpt": args.ckpt, "no_tools": args.no_tools, "samples": args.samples}
    with tempfile.TemporaryDirectory() as root:
        for mode in args.modes:
            t0 = time.perf_counter()
            output = Path(root) / f"{mode}.json"
            status = entry_point(eval_args(args, mode, output, root))
            if status:
                raise SystemExit(status)
            result = json.loads(output.read_text())
            result["seconds"] = round(time.perf_counter() - t0, 1)
            report["problems"] = result["prompts"]
            report[mode] = result
            print(mode, json.dumps(result), flush=True)
    report["seconds_total"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


def _read_csv(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def cmd_plot(args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _read_csv(args.csv)

    def series(key: str):
        xs, ys = [], []
        elapsed = 0.0
        for row in rows:
            if row.get("time/step_s"):
                elapsed += float(row["time/step_s"])
            value = row.get(key)
            if value not in (None, ""):
                xs.append(elapsed / 60 if args.x == "minutes" else float(row.get("step") or len(xs)))
                ys.append(float(value))
        return xs, ys

    def smooth(ys, window):
        out = []
        for i in range(len(ys)):
            chunk = ys[max(0, i - window + 1) : i + 1]
            out.append(sum(chunk) / len(chunk))
        return out

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for key, label, color in [
        (args.accuracy_key, "train accuracy (T=1, per step)", "tab:blue"),
        (args.format_key, args.format_label, "tab:orange"),
    ]:
        xs, ys = series(key)
        if xs:
            ax.plot(xs, ys, color=color, alpha=0.2, linewidth=1)
            ax.plot(xs, smooth(ys, args.window), color=color, label=f"{label}, mean of {args.window}")
    xs, ys = series("val/accuracy")
    if xs:
        ax.plot(xs, ys, "o-", color="tab:green", label="val accuracy (greedy, 50 held-out)")
    for path, marker in [(args.before, "s"), (args.after, "D")]:
        if not path:
            continue
        report = json.loads(Path(path).read_text())
        x = 0 if marker == "s" else (series(args.accuracy_key)[0] or [0])[-1]
        for mode, color in [("temperature", "tab:purple"), ("greedy", "tab:red")]:
            if mode in report:
                acc = report[mode]["accuracy"]
                ax.plot(
                    [x],
                    [acc],
                    marker,
                    color=color,
                    markersize=8,
                    label=f"{'before' if marker == 's' else 'after'}: {mode} accuracy "
                    f"on {report['problems']} = {acc:.1%}",
                )
    ax.set_xlabel(
        "minutes of training steps (sum of time/step_s; validation and checkpoint writes excluded)"
        if args.x == "minutes"
        else "rollout step"
    )
    ax.set_ylabel("rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title(args.title)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("eval", help="accuracy and format rate on held-out problems")
    ev.add_argument("--config", default="configs/smollm2_arithmetic.yaml")
    ev.add_argument("--ckpt", default=None, help="Lightning checkpoint whose policy weights to load")
    ev.add_argument("--num", type=int, default=200)
    ev.add_argument("--modes", nargs="+", default=["temperature", "greedy"], choices=["temperature", "greedy"])
    ev.add_argument("--temperature", type=float, default=1.0)
    ev.add_argument("--samples", type=int, default=1, help="samples per problem at temperature (pass@k, majority vote)")
    ev.add_argument("--max-new-tokens", type=int, default=None, help="default: the recipe's sampling.max_new_tokens")
    ev.add_argument("--batch-size", type=int, default=50, help="at most this many problems per batch")
    ev.add_argument("--threads", type=int, default=1)
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--out", default=None, help="write the JSON report here")
    ev.add_argument("--no-tools", action="store_true", help="evaluate without the policy's tools (multi-turn recipes)")
    ev.set_defaults(fn=cmd_eval)
    pl = sub.add_parser("plot", help="training curve of a run from its CSV log")
    pl.add_argument("--csv", required=True)
    pl.add_argument("--out", default="runs/smollm2_arithmetic.png")
    pl.add_argument("--before", default=None, help="JSON report of `eval` before training")
    pl.add_argument("--after", default=None, help="JSON report of `eval` after training")
    pl.add_argument("--accuracy-key", default="train/rewards/math_accuracy")
    pl.add_argument("--format-key", default="train/rewards/boxed_format")
    pl.add_argument("--format-label", default="train boxed rate (T=1, per step)")
    pl.add_argument("--window", type=int, default=10)
    pl.add_argument("--x", choices=["minutes", "step"], default="minutes")
    pl.add_argument("--title", default="GRPO, SmolLM2-135M-Instruct, 2-digit addition, 2-core CPU")
    pl.set_defaults(fn=cmd_plot)
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.overrides = argv[split + 1 :]
    args.fn(args)


if __name__ == "__main__":
    main()

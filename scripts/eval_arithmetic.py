r"""Evaluate a policy on the held-out problems of a recipe's task, and plot a run's training curve.

    # accuracy and format rate on the 200 held-out problems, sampled at temperature 1.0 and greedily
    python scripts/eval_arithmetic.py eval --config configs/smollm2_arithmetic.yaml
    python scripts/eval_arithmetic.py eval --config configs/smollm2_arithmetic.yaml \
        --ckpt /tmp/run/csv/checkpoints/final.ckpt
    # a tool-use recipe: tool use rate and calls are reported too; --no-tools takes the tools away
    python scripts/eval_arithmetic.py eval --config configs/smollm2_calculator.yaml --num 100 --no-tools

    # the curve of a run (its CSV log) as a PNG
    python scripts/eval_arithmetic.py plot --csv /tmp/run/csv/version_0/metrics.csv --out runs/smollm2_arithmetic.png

(`/tmp/run` as in `scripts/train_smollm2_arithmetic.sh /tmp/run`, which logs to RUN_DIR/csv/version_0/ and puts
the checkpoints, last.ckpt and final.ckpt, in RUN_DIR/csv/checkpoints/.)

`eval` builds the policy, the task and the reward callbacks from the recipe YAML (so prompts,
answer extraction and format check are the recipe's), optionally loads the policy weights of a
Lightning checkpoint (a recipe whose policy starts from an earlier stage's checkpoint is evaluated
untrained without `--ckpt`: pass that stage's checkpoint to evaluate it), and calls `HFPolicy.sample`
directly on the task's validation examples. It reports `rlvr_lightning.evaluation.metrics.ValidationMetrics`
(accuracy from the first `kind: task` reward, format rate from the first `kind: format` reward, pass@k
and majority vote when `--samples` > 1, mean response length) for each decoding mode, plus wall time,
as JSON.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import yaml  # noqa: E402


def _instantiate(spec):
    """Objects from `class_path`/`init_args` specs, nested in dicts and lists (e.g. a policy's tools)."""
    if isinstance(spec, list):
        return [_instantiate(item) for item in spec]
    if not (isinstance(spec, dict) and "class_path" in spec):
        return spec
    module_name, _, class_name = spec["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(**{k: _instantiate(v) for k, v in (spec.get("init_args") or {}).items()})


def build(config_path: str, ckpt: str | None, no_tools: bool = False):
    from rlvr_lightning.generation.sampling_config import SamplingConfig
    from rlvr_lightning.rewards.base import RewardCallback

    config = yaml.safe_load(Path(config_path).read_text())
    model_args = config["model"]["init_args"]
    if no_tools:  # the same recipe with the policy's tools taken away (the control of a tool-use recipe)
        model_args["policy"].get("init_args", {}).pop("tools", None)
    policy_spec = model_args["policy"]
    if policy_spec["class_path"].endswith("policy_from_checkpoint"):  # a later stage: its weights come from --ckpt
        policy_spec = policy_spec["init_args"]["policy"]
    policy = _instantiate(policy_spec)
    if ckpt:
        state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
        policy_state = {k.removeprefix("policy."): v for k, v in state.items() if k.startswith("policy.")}
        missing, unexpected = policy.load_state_dict(policy_state, strict=False)
        missing = [k for k in missing if not k.startswith("reference")]
        if missing or unexpected:
            raise RuntimeError(
                f"checkpoint does not fit the policy: missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
    policy.eval()
    task = _instantiate(config["data"]["init_args"]["task"])
    rewards = [
        cb
        for cb in (
            _instantiate(spec) for spec in config["trainer"].get("callbacks", []) if "rewards" in spec["class_path"]
        )
        if isinstance(cb, RewardCallback)
    ]
    sampling = SamplingConfig(**(model_args.get("sampling") or {}))
    return policy, task, rewards, sampling


def evaluate(policy, examples, rewards, sampling, samples: int, batch_size: int) -> dict[str, float]:
    from rlvr_lightning.data.task import collate_examples
    from rlvr_lightning.evaluation.metrics import ValidationMetrics
    from rlvr_lightning.rollout import TokenSource

    metrics = ValidationMetrics(group_size=samples)
    task_reward = next((r for r in rewards if r.kind == "task"), None)
    format_reward = next((r for r in rewards if r.kind == "format"), None)
    errors = 0
    tool_rows = tool_calls = tool_errors = tool_users = 0.0
    for start in range(0, len(examples), batch_size):
        batch = collate_examples(examples[start : start + batch_size])
        rollout = policy.sample(batch, samples, sampling)
        stats = getattr(policy, "last_generation_stats", {})
        if "tool_calls/mean" in stats:  # multi-turn rollouts: how the tools were used
            tool_rows += rollout.num_rows
            tool_calls += stats["tool_calls/mean"] * rollout.num_rows
            tool_errors += stats["tool_errors"]
            tool_users += float((rollout.response_source == TokenSource.TOOL).any(-1).sum())
        correct = answers = format_ok = None
        if task_reward is not None:
            scores = task_reward(rollout)
            correct = task_reward.is_correct(rollout, scores)
            answers = task_reward.extract_answers(rollout)
            errors += task_reward.pop_errors()
        if format_reward is not None:
            format_ok = format_reward.is_correct(rollout, format_reward(rollout))
        metrics.update(rollout, correct, answers, format_ok)
    out = {k: round(float(v), 4) for k, v in metrics.compute().items()}
    out["reward_errors"] = errors
    if tool_rows:
        out["tool_use_rate"] = round(tool_users / tool_rows, 4)  # responses with at least one tool call
        out["tool_calls_per_response"] = round(tool_calls / tool_rows, 4)
        out["tool_errors_per_call"] = round(tool_errors / max(tool_calls, 1), 4)
    return out


def cmd_eval(args) -> None:
    import dataclasses

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    policy, task, rewards, sampling = build(args.config, args.ckpt, args.no_tools)
    if args.max_new_tokens:
        sampling = dataclasses.replace(sampling, max_new_tokens=args.max_new_tokens)
    examples = task.val_examples() if hasattr(task, "val_examples") else list(task.val_dataset())
    examples = examples[: args.num]
    report: dict = {
        "config": args.config,
        "ckpt": args.ckpt,
        "no_tools": args.no_tools,
        "problems": len(examples),
        "max_new_tokens": sampling.max_new_tokens,
        "samples": args.samples,
    }
    modes = {
        "temperature": dataclasses.replace(sampling, temperature=args.temperature, do_sample=True),
        "greedy": dataclasses.replace(sampling, do_sample=False),
    }
    for mode in args.modes:
        t0 = time.perf_counter()
        samples = args.samples if mode == "temperature" else 1
        result = evaluate(policy, examples, rewards, modes[mode], samples, args.batch_size)
        result["seconds"] = round(time.perf_counter() - t0, 1)
        if mode == "temperature":
            result["temperature"] = args.temperature
        report[mode] = result
        print(mode, json.dumps(result), flush=True)
    for reward in rewards:
        close = getattr(reward, "close", None)
        if close:
            close()
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
    ev.add_argument("--batch-size", type=int, default=50)
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
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    args.fn(args)


if __name__ == "__main__":
    main()

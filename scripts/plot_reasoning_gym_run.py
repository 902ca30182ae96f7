"""A reasoning-gym run's figure: difficulty level and pass rate per dataset at every curriculum refresh, and the
training accuracy per dataset; with `--before`/`--after` (the JSON reports of `rlvr eval`, or metrics.csv of
`rlvr validate` runs), a table of the held-out accuracy per dataset.

    rlvr eval --config configs/reasoning_gym_smollm2.yaml --eval.output runs/rg_before.json
    rlvr eval --config configs/reasoning_gym_smollm2.yaml --ckpt_path last --eval.output runs/rg_after.json
    python scripts/plot_reasoning_gym_run.py runs/csv/version_0/metrics.csv \
        --before runs/rg_before.json --after runs/rg_after.json --plot docs/reasoning_gym_smollm2.png
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from collections import defaultdict

LEVEL = re.compile(r"curriculum/(.+)/level")
TRAIN_ACCURACY = re.compile(r"train/reasoning_gym/(.+)/accuracy")
VAL_ACCURACY = re.compile(r"val/reasoning_gym/(.+)/accuracy")


def rows(path: str) -> list[dict[str, str]]:
    with open(path) as handle:
        return list(csv.DictReader(handle))


def series(table: list[dict[str, str]], pattern: re.Pattern) -> dict[str, list[tuple[float, float]]]:
    """`{dataset: [(step, value), ...]}` of the columns `pattern` matches."""
    found: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for row in table:
        for key, value in row.items():
            match = pattern.fullmatch(key or "")
            if match and value not in ("", None):
                found[match.group(1)].append((float(row.get("step") or 0), float(value)))
    return dict(found)


def held_out(path: str) -> dict[str, float]:
    """Each dataset's held-out accuracy: from an `rlvr eval` report (.json) or the last validation of a CSV log."""
    if path.endswith(".json"):
        report = json.loads(open(path).read())
        pattern = re.compile(VAL_ACCURACY.pattern.removeprefix("val/"))
        return {match.group(1): value for key, value in report.items() if (match := pattern.fullmatch(key))}
    return {name: points[-1][1] for name, points in series(rows(path), VAL_ACCURACY).items()}


def plot(table: list[dict[str, str]], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels, rates = series(table, LEVEL), series(table, re.compile(r"curriculum/(.+)/pass_rate"))
    accuracy = series(table, TRAIN_ACCURACY)
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    names = sorted(set(levels) | set(rates) | set(accuracy))
    color = {name: f"C{k}" for k, name in enumerate(names)}  # one colour per dataset in every panel
    for name, points in sorted(levels.items()):
        axes[0].step(*zip(*points, strict=True), where="post", marker="o", label=name, color=color[name])
    for name, points in sorted(rates.items()):
        axes[1].plot(*zip(*points, strict=True), marker="o", label=name, color=color[name])
    for name, points in sorted(accuracy.items()):
        steps, values = zip(*points, strict=True)
        window = 4
        smooth = [
            sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
            for i in range(len(values))
        ]
        axes[2].plot(steps, smooth, label=name, color=color[name])
    axes[0].set(xlabel="rollout step", ylabel="level", title="difficulty level after each refresh")
    axes[1].set(xlabel="rollout step", ylabel="pass rate", title="pass rate of the refresh's candidates", ylim=(0, 1))
    axes[2].set(xlabel="rollout step", ylabel="accuracy", title="training accuracy (mean of 4 steps)", ylim=(0, 1))
    top = max((v for points in levels.values() for _, v in points), default=0)
    axes[0].set_ylim(-0.3, top + 1.3)
    axes[0].yaxis.get_major_locator().set_params(integer=True)
    for ax in axes:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", help="the training run's metrics.csv (CSVLogger)")
    parser.add_argument(
        "--before", help="before training: `rlvr eval`'s report (.json) or `rlvr validate`'s metrics.csv"
    )
    parser.add_argument("--after", help="the same of the trained checkpoint")
    parser.add_argument("--plot", help="write the figure here (PNG)")
    args = parser.parse_args()
    table = rows(args.metrics)
    for name, points in sorted(series(table, LEVEL).items()):
        print(f"{name}: levels at steps {[(int(s), int(v)) for s, v in points]}")
    if args.before and args.after:
        before, after = held_out(args.before), held_out(args.after)
        print("| dataset | held-out accuracy before | after |\n|---|---|---|")
        for name in sorted(before):
            print(f"| {name} | {before[name]:.3f} | {after.get(name, float('nan')):.3f} |")
    if args.plot:
        plot(table, args.plot)


if __name__ == "__main__":
    main()

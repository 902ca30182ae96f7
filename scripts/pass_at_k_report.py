"""`scripts/compare.py --pass_at_k`: the last validation's pass@k for every k the runs logged (`val/pass@K`, sampled
validation with `validation.pass_at_k`), one row per recipe, mean ± sample std over its seeds.

A run is anything with `recipe`, `seed` and `ok` (compare.py's `Run`); its log is
`WORKDIR/RECIPE/seed_SEED/metrics.csv`.
"""

from __future__ import annotations

import csv
import re
import statistics
from pathlib import Path

PASS_AT = re.compile(r"^val/pass@(\d+)$")


def last_pass_at_k(csv_path: Path) -> dict[int, float]:
    """k -> the last logged `val/pass@k` of a CSV log (empty when it logged none)."""
    values: dict[int, float] = {}
    if not csv_path.is_file():
        return values
    with csv_path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            for key, value in row.items():
                match = PASS_AT.match(key or "")
                if match and value not in ("", None):
                    values[int(match.group(1))] = float(value)
    return values


def pass_at_k_table(runs, order: list[str], workdir: Path) -> list[str]:
    """Markdown lines: recipe | pass@k for each k any run logged (mean ± std over the recipe's seeds, in %)."""
    per_recipe: dict[str, list[dict[int, float]]] = {}
    for run in runs:
        if run.ok:
            logged = last_pass_at_k(workdir / run.recipe / f"seed_{run.seed}" / "metrics.csv")
            per_recipe.setdefault(run.recipe, []).append(logged)
    ks = sorted({k for logs in per_recipe.values() for logged in logs for k in logged})
    if not ks:
        return []
    lines = ["| recipe | " + " | ".join(f"pass@{k}" for k in ks) + " |", "| --- |" + " ---: |" * len(ks)]
    for recipe in order:
        cells = []
        for k in ks:
            values = [logged[k] for logged in per_recipe.get(recipe, []) if k in logged]
            if not values:
                cells.append("—")
            elif len(values) == 1:
                cells.append(f"{values[0] * 100:.1f}%")
            else:
                cells.append(f"{statistics.fmean(values) * 100:.1f}% ± {statistics.stdev(values) * 100:.1f}%")
        lines.append(f"| {recipe} | " + " | ".join(cells) + " |")
    return lines


def report_section(runs, order: list[str], workdir: Path) -> list[str]:
    table = pass_at_k_table(runs, order, workdir)
    if not table:
        return ["No run logged a `val/pass@k` (validate by sampling: `validation: {group_size, greedy: false}`).", ""]
    return [
        "## pass@k at the last validation",
        "",
        *table,
        "",
        "- the unbiased pass@k estimate over the validation prompts (`val/pass@k`), mean ± sample std over seeds.",
        "",
    ]


__all__ = ["last_pass_at_k", "pass_at_k_table", "report_section"]

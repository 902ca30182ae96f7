"""Regenerate the golden trajectories, deliberately, with the reason the trajectories changed.

    python -m tests.golden.update --reason "PPOClip clips the ratio before the mean (was after)"
    python -m tests.golden.update recipe_ppo recipe_grpo --reason "..."     # only these runs

Makes the golden runs (tests/golden/runs.py) in a fresh pinned process and writes tests/golden/NAME.json for
each run whose trajectory differs from its file (or has none); a file whose trajectory is unchanged is left
as it is, its reason too. With every run made, the files of runs that no longer exist are removed.
Commit the files with the change that moved the trajectories.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path

from tests.golden.runs import PINNED, golden_runs, run_pinned

GOLDEN_DIR = Path(__file__).resolve().parent


def golden_path(name: str) -> Path:
    return GOLDEN_DIR / f"{name}.json"


def read_golden(name: str) -> dict | None:
    path = golden_path(name)
    return json.loads(path.read_text()) if path.is_file() else None


def render(record: dict) -> str:
    """JSON with one step's metrics a line, so that a diff shows which steps moved."""
    head = {k: v for k, v in record.items() if k != "rows"}
    text = json.dumps(head, indent=1)[:-2]  # without the closing "\n}"
    rows = ",\n".join("  " + json.dumps(row) for row in record["rows"])
    return f'{text},\n "rows": [\n{rows}\n ]\n}}\n'


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="golden runs to regenerate (default: all)")
    parser.add_argument("--reason", required=True, help="why the trajectories changed (written into each file)")
    args = parser.parse_args(argv)
    runs = {run.name: run for run in golden_runs()}
    unknown = sorted(set(args.names) - set(runs))
    if unknown:
        parser.error(f"unknown golden runs {unknown}; choose from {sorted(runs)}")
    with tempfile.TemporaryDirectory() as tmp:
        made = run_pinned(args.names, Path(tmp) / "trajectories.json")
    from rlvr_lightning.runtime.run_environment import cpu_model

    for name, rows in made["runs"].items():
        old = read_golden(name)
        if old is not None and json.dumps(old["rows"]) == json.dumps(rows):
            print(f"{name}: unchanged")
            continue
        record = {
            "run": name,
            "command": runs[name].command(),
            "environment": PINNED,
            "recorded": {
                "date": datetime.date.today().isoformat(),
                "torch": made["torch"],
                "cpu_capability": made["cpu_capability"],
                "cpu": cpu_model(),
            },
            "reason": args.reason,
            "rows": rows,
        }
        golden_path(name).write_text(render(record))
        print(f"{name}: {'written' if old is None else 'changed'} ({len(rows)} rows)")
    if not args.names:
        for stale in sorted(set(p.stem for p in GOLDEN_DIR.glob("*.json")) - set(runs)):
            golden_path(stale).unlink()
            print(f"{stale}: removed (no such golden run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

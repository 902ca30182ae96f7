"""Regenerate the golden trajectories, deliberately, with the reason the trajectories changed.

    python -m tests.golden.update --reason "PPOClip clips the ratio before the mean (was after)"
    python -m tests.golden.update recipe_ppo recipe_grpo --reason "..."     # only these runs

Makes the golden runs (tests/golden/runs.py) in a fresh pinned process and writes tests/golden/VENDOR/NAME.json
(VENDOR: this CPU's, `runs.cpu_vendor`) for each run whose trajectory differs from its file (or has none); a file
whose trajectory is unchanged is left as it is, its reason too. A changed trajectory removes the run's files of
the other vendors, which were recorded before the change and can only be remade on their CPUs (there the test
skips the run until then). With every run made, the files of runs that no longer exist are removed.
Commit the files with the change that moved the trajectories.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path

from tests.golden.runs import PINNED, cpu_vendor, golden_runs, run_pinned

GOLDEN_DIR = Path(__file__).resolve().parent


def vendors() -> list[str]:
    """The CPU vendors with golden files (tests/golden/VENDOR/)."""
    return sorted(path.name for path in GOLDEN_DIR.iterdir() if path.is_dir() and any(path.glob("*.json")))


def golden_path(name: str, vendor: str | None = None) -> Path:
    return GOLDEN_DIR / (vendor or cpu_vendor()) / f"{name}.json"


def read_golden(name: str, vendor: str | None = None) -> dict | None:
    path = golden_path(name, vendor)
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
        path = golden_path(name)
        path.parent.mkdir(exist_ok=True)
        path.write_text(render(record))
        print(f"{name}: {'written' if old is None else 'changed'} ({len(rows)} rows, {path.parent.name})")
        if old is None:
            continue
        for other in set(vendors()) - {cpu_vendor()}:  # recorded before the change: only their CPUs can remake them
            if golden_path(name, other).is_file():
                golden_path(name, other).unlink()
                print(f"{name}: removed the {other} file (recorded before this change; remake it on such a CPU)")
    if not args.names:
        for vendor in vendors():
            for stale in sorted({p.stem for p in (GOLDEN_DIR / vendor).glob("*.json")} - set(runs)):
                golden_path(stale, vendor).unlink()
                print(f"{stale}: removed the {vendor} file (no such golden run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
r"""Check the math verifier against every GSM8K gold answer.

For each example (gold = the number after ``####``):

* ``\boxed{gold}`` in a fake completion must score 1 (extraction + verification);
* a perturbed answer (gold + 1 for integers, gold * 2 + 1 otherwise) must score 0;
* (unless ``--skip-rewrite``) the same value written differently,
  ``\boxed{\frac{2*gold}{2}}``, must score 1: this one is always decided by
  math-verify in the worker processes, not by the string fast path.

Usage:
    python scripts/check_gsm8k_answers.py [DIR] [--workers N] [--timeout S]

DIR (or ``--data-dir DIR``) must hold ``train.jsonl`` and ``test.jsonl`` (one
``{"question": ..., "answer": ...}`` object per line); it defaults to ``<repo root>/../shared/data/gsm8k``.
The files are not part of this repository: GSM8K's own are at
https://github.com/openai/grade-school-math (``grade_school_math/data/{train,test}.jsonl``), or
``datasets`` writes them:

    python -c "from datasets import load_dataset; \
        [load_dataset('openai/gsm8k', 'main', split=s).to_json(f'DIR/{s}.jsonl') for s in ('train', 'test')]"

Exit code 0 when every check passed, 1 when one failed, 2 when a file is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from decimal import Decimal, InvalidOperation
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rlvr_lightning.grading.answers import extract_gsm8k  # noqa: E402
from rlvr_lightning.grading.math_equivalence import MathVerifier  # noqa: E402


def perturb(gold: str) -> str:
    value = Decimal(gold)
    if value == value.to_integral_value():
        return str(int(value) + 1)
    return str(value * 2 + 1)


def load(path: Path, problems: list[str]) -> list[tuple[str, int, str]]:
    """(file name, line number, gold) per valid line; malformed lines go to ``problems``."""
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                answer = obj["answer"]
                obj["question"]
            except (ValueError, KeyError, TypeError) as e:
                problems.append(f"{path.name}:{lineno}: malformed line ({type(e).__name__}: {e})")
                continue
            gold = extract_gsm8k(answer)
            if gold is None:
                problems.append(f"{path.name}:{lineno}: no '#### <number>' in the answer")
                continue
            try:
                Decimal(gold)
            except InvalidOperation:
                problems.append(f"{path.name}:{lineno}: gold {gold!r} is not a number")
                continue
            rows.append((path.name, lineno, gold))
    return rows


DEFAULT_DATA_DIR = REPO.parent / "shared" / "data" / "gsm8k"
WHERE_TO_GET = (
    "GSM8K is not part of this repository. Get train.jsonl and test.jsonl from "
    "https://github.com/openai/grade-school-math (grade_school_math/data/), or write them with\n"
    '  python -c "from datasets import load_dataset; \\\n'
    "    [load_dataset('openai/gsm8k', 'main', split=s).to_json(f'DIR/{s}.jsonl') for s in ('train', 'test')]\"\n"
    "and pass their directory: python scripts/check_gsm8k_answers.py DIR"
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data_dir_arg", nargs="?", type=Path, metavar="DIR", help="directory of train.jsonl and test.jsonl")
    ap.add_argument("--data-dir", type=Path, default=None, help=f"the same as DIR (default: {DEFAULT_DATA_DIR})")
    ap.add_argument("--files", nargs="+", default=["train.jsonl", "test.jsonl"])
    ap.add_argument("--workers", type=int, default=max(2, os.cpu_count() or 2))
    ap.add_argument("--timeout", type=float, default=5.0, help="per-answer budget (seconds)")
    ap.add_argument("--skip-rewrite", action="store_true", help="skip the \\frac{2g}{2} check")
    ap.add_argument("--max-failures", type=int, default=50, help="how many failures to list")
    args = ap.parse_args(argv)
    args.data_dir = args.data_dir_arg or args.data_dir or DEFAULT_DATA_DIR

    t0 = time.monotonic()
    problems: list[str] = []
    rows: list[tuple[str, int, str]] = []
    for name in args.files:
        path = args.data_dir / name
        if not path.is_file():
            print(f"missing file: {path}\n{WHERE_TO_GET}", file=sys.stderr)
            return 2
        rows += load(path, problems)
    golds = [g for _, _, g in rows]
    checks = [
        ("gold", [f"Some reasoning.\nSo the result is $\\boxed{{{g}}}$." for g in golds], 1.0),
        ("perturbed", [f"Some reasoning.\nSo the result is $\\boxed{{{perturb(g)}}}$." for g in golds], 0.0),
    ]
    if not args.skip_rewrite:
        checks.append(("rewrite", [f"So $\\boxed{{\\frac{{{Decimal(g) * 2}}}{{2}}}}$." for g in golds], 1.0))

    counts: dict[str, int] = {}
    timeouts = 0
    failures: list[str] = []
    with MathVerifier(workers=args.workers, timeout_s=args.timeout) as verifier:
        for name, completions, want in checks:
            t = time.monotonic()
            scores, failed = verifier.score(completions, golds)
            timeouts += failed
            counts[name] = sum(1 for s in scores if s == want)
            for (fname, lineno, gold), completion, s in zip(rows, completions, scores, strict=True):
                if s != want:
                    failures.append(
                        f"{fname}:{lineno}: {name} check: gold {gold!r}, completion {completion[-60:]!r} scored {s}"
                    )
            print(f"  {name:9s} {counts[name]}/{len(golds)} as expected ({time.monotonic() - t:.1f} s)")

    wall = time.monotonic() - t0
    print(f"files: {', '.join(str(args.data_dir / f) for f in args.files)}")
    print(f"total examples:        {len(rows)} (+{len(problems)} malformed)")
    print(f"correct-gold matches:  {counts['gold']}/{len(rows)}")
    print(f"perturbed rejections:  {counts['perturbed']}/{len(rows)}")
    if "rewrite" in counts:
        print(f"rewrite (math-verify): {counts['rewrite']}/{len(rows)}")
    print(f"time-outs/crashes:     {timeouts}")
    print(f"wall time:             {wall:.1f} s ({args.workers} workers, timeout {args.timeout} s)")
    for p in problems:
        print("MALFORMED", p)
    for f in failures[: args.max_failures]:
        print("FAIL", f)
    if len(failures) > args.max_failures:
        print(f"... and {len(failures) - args.max_failures} more failures")
    return 0 if not failures and not problems and not timeouts else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Write the format warm-up pairs of the SmolLM2 arithmetic recipe (configs/smollm2_arithmetic_warmup.yaml).

    python scripts/make_arithmetic_warmup.py            # -> configs/data/arithmetic_format_warmup.jsonl

Every 1-digit sum `a + b` (a, b in 0..9: 100 pairs), asked with the recipe's prompt and answered in the
format the recipe's reward checks: "3 + 5 = \\boxed{8}". The recipe trains and evaluates on 2-digit sums,
none of which appears here: the pairs teach where the answer goes (write the sum, box the result),
not the skill the RL stage is measured on.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def warmup_pairs(seed: int = 0) -> list[dict]:
    from rlvr_lightning.data.templates import apply_template, resolve_template

    template = resolve_template("chat_boxed")
    pairs = [
        {
            "prompt": apply_template(template, f"What is {a} + {b}?"),
            "response": f"{a} + {b} = \\boxed{{{a + b}}}",
            "answer": str(a + b),
        }
        for a in range(10)
        for b in range(10)
    ]
    random.Random(seed).shuffle(pairs)
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(REPO / "configs" / "data" / "arithmetic_format_warmup.jsonl"))
    args = parser.parse_args()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as handle:
        for pair in warmup_pairs():
            handle.write(json.dumps(pair) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

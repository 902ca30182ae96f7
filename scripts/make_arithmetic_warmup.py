#!/usr/bin/env python
"""Write the format warm-up pairs of the SmolLM2 arithmetic recipe (configs/smollm2_arithmetic_warmup.yaml).

    python scripts/make_arithmetic_warmup.py            # -> configs/data/arithmetic_format_warmup.jsonl

Every 1-digit sum `a + b` (a, b in 0..9: 100 pairs), asked with the recipe's prompt and answered in the
format the recipe's reward checks: "3 + 5 = \\boxed{8}". The recipe trains and evaluates on 2-digit sums,
none of which appears here: the pairs teach where the answer goes (write the sum, box the result),
not the skill the RL stage is measured on.

    python scripts/make_arithmetic_warmup.py --confidence   # -> configs/data/arithmetic_confidence_warmup.jsonl

asks with the `chat_boxed_confidence` template and follows each answer with a confidence drawn uniformly from 0.1,
0.2, ..., 0.9 ("3 + 5 = \\boxed{8} <confidence>0.3</confidence>"): the format of RLCR's recipe
(configs/smollm2_rlcr.yaml), with no information in the number, which the RL stage learns to set.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def warmup_pairs(seed: int = 0, confidence: bool = False) -> list[dict]:
    from rlvr_lightning.data.templates import apply_template, resolve_template

    template = resolve_template("chat_boxed_confidence" if confidence else "chat_boxed")
    rng = random.Random(seed)
    pairs = []
    for a in range(10):
        for b in range(10):
            response = f"{a} + {b} = \\boxed{{{a + b}}}"
            if confidence:
                response += f" <confidence>{rng.randint(1, 9) / 10:.1f}</confidence>"
            pairs.append(
                {"prompt": apply_template(template, f"What is {a} + {b}?"), "response": response, "answer": str(a + b)}
            )
    random.Random(seed).shuffle(pairs)
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="default: configs/data/arithmetic_{format,confidence}_warmup.jsonl")
    parser.add_argument("--confidence", action="store_true", help="RLCR's format: a confidence after each answer")
    args = parser.parse_args()
    name = "arithmetic_confidence_warmup.jsonl" if args.confidence else "arithmetic_format_warmup.jsonl"
    out = Path(args.out or REPO / "configs" / "data" / name)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as handle:
        for pair in warmup_pairs(confidence=args.confidence):
            handle.write(json.dumps(pair) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Host time of the per-step stop-string check (`RowEnds.end`) with and without the byte-level pre-filter
(`generation/stop_strings.py`), side by side in one process: `--rows` rows of text tokens (`bench_corpus` with
an `<answer>N</answer>` every 50 lines, encoded with SmolLM2's tokenizer where it is fetched, else the tiny
byte-level one), `--steps` steps; the legs alternate in each of `--rounds` rounds, and the script prints each
leg's median ms per step, the ratio, and whether both legs ended the same rows at the same steps. One tokenizer
thread (RAYON_NUM_THREADS=1).

    python scripts/bench_stop_strings.py                          # 128 rows, "</answer>" (the GSM8K recipe's)
    python scripts/bench_stop_strings.py --stop "</tool_call>" "\\n\\nQuestion" --rows 64
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlvr_lightning.demos.tiny_lm import bench_corpus, build_tiny_tokenizer  # noqa: E402
from rlvr_lightning.generation.output import StopStringChecker  # noqa: E402
from rlvr_lightning.generation.row_ends import RowEnds  # noqa: E402
from rlvr_lightning.generation.stop_strings import stop_string_end_filter  # noqa: E402


def load_tokenizer():
    from transformers import AutoTokenizer

    from rlvr_lightning.runtime.model_cache import is_fetched, model_dir

    if is_fetched("smollm2-135m-instruct"):
        return "SmolLM2-135M-Instruct", AutoTokenizer.from_pretrained(str(model_dir("smollm2-135m-instruct")))
    return "tiny byte-level BPE", build_tiny_tokenizer(vocab_size=500, corpus=bench_corpus())


def run(tokenizer, tokens: list[list[int]], stops: list[str], filtered: bool) -> tuple[float, list[int]]:
    decode = lambda rows: tokenizer.batch_decode(rows, skip_special_tokens=True)  # noqa: E731
    may_end = stop_string_end_filter(tokenizer, stops) if filtered else None
    steps = len(tokens[0])
    ends = RowEnds(len(tokens), steps, [], StopStringChecker(stops, decode, may_end), None)
    started = time.perf_counter()
    for step in range(steps):
        ends.end([row[step] for row in tokens], step)  # ended rows are skipped inside
    return (time.perf_counter() - started) / steps * 1e3, ends.lengths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--steps", type=int, default=256)
    parser.add_argument("--stop", nargs="+", default=["</answer>"])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    name, tokenizer = load_tokenizer()
    lines = [line + (f" <answer>{i}</answer>" if i % 50 == 49 else "") for i, line in enumerate(bench_corpus(4000))]
    stream = tokenizer.encode(" ".join(lines), add_special_tokens=False)  # an answer now and then
    tokens = [stream[i * 97 : i * 97 + args.steps] for i in range(args.rows)]  # overlapping windows of real text
    times: dict[bool, list[float]] = {False: [], True: []}
    lengths = {}
    for _ in range(args.rounds):
        for filtered in (False, True):
            ms, lengths[filtered] = run(tokenizer, tokens, args.stop, filtered)
            times[filtered].append(ms)
    plain, fast = statistics.median(times[False]), statistics.median(times[True])
    print(f"# {datetime.date.today()}, {name} tokenizer, {args.rows} rows x {args.steps} steps, stops {args.stop}")
    print(f"without the filter: {plain:.3f} ms per step; with it: {fast:.3f} ms per step ({plain / fast:.1f}x)")
    same = lengths[False] == lengths[True]
    print(f"rows ended at the same steps: {same} ({sum(n < args.steps for n in lengths[False])} rows ended early)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
r"""Decoding speed of our sampling loop's variants, side by side in one process, on models of real shapes with
random weights (built from a config: nothing is downloaded).

Variants (`--variants`):

* `eager`: `KVCacheGeneration`'s loop (`generation/loop.py`): the step's operators launched from Python, a cache
  that grows, one host read per step;
* `static`: `StaticCacheGeneration` with `compile: none` (static cache and device state, the step eager);
* `aot_eager`, `compiled`, `reduce-overhead`: the static step under `torch.compile(fullgraph=True)` with the
  `aot_eager` backend, inductor, inductor with CUDA graphs;
* `compiled-forward`: the model's forward compiled by inductor, the rest of the step eager, the whole captured in a
  `torch.cuda.CUDAGraph` (what the default runs where inductor cannot compile the whole step);
* `cuda-graph`: the eager static step captured in a `torch.cuda.CUDAGraph`.

Every row decodes `--new-tokens` tokens (EOS is excluded by `min_new_tokens`), so all variants run the same
steps. After each variant's first generation, `--repeats` rounds run the variants in turn; per (model, rows,
variant) it prints, for its median round, the decoding time per step (`ms/step`, the prefill left out) and the
tokens per second; the bytes a step must read (the weights once, plus the keys and values it attends to: the
grown cache for `eager`, the whole static cache for the others) over its time, and that as a fraction of the
device's peak (`of peak`: a large device-to-device copy's rate, measured at the start); the first run's extra
seconds (`compile s`: compilation, capture, warm-up); host synchronisations per step (CUDA's sync debug mode,
counted on a separate run; `-` on a CPU, where nothing waits); with `--count-launches`, the operations a step
launches from Python (`kernel_counter.py`: eager variants only, from two more generations); rows whose tokens
equal the `eager` variant's for the same random stream (n of N), how many of the others first differ by a token
whose id neighbours the eager one's (`adjacent`: a draw moved across one step of the CDF by rounding, as in fp32
at a vocabulary of 151,936 near-uniform entries; `--dtype float64` then gives equal tokens) and the largest log-prob
difference on the equal rows. A line says when inductor ran a variant's step without its CUDA graphs (its warning
above it says why: the kernels are then launched from Python).

    python scripts/bench_decode.py --device cpu                         # tiny shapes, a quick check
    python scripts/bench_decode.py --device cpu --models smollm2 --rows 8 --new-tokens 16
    python scripts/bench_decode.py --device cpu --models smollm2 qwen2.5-1.5b --rows 8 --variants eager static \
        --new-tokens 8 --prompt-tokens 16 --repeats 1 --count-launches
    python scripts/bench_decode.py --device cuda        # SmolLM2-135M, Qwen2.5-1.5B; 64, 128 rows; bf16
    python scripts/bench_decode.py --device cuda --variants eager compiled --models smollm2 --rows 128
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from bench_failures import reported_failure  # noqa: E402

from rlvr_lightning.demos.model_shapes import QWEN2_5_1_5B, SMOLLM2_135M  # noqa: E402
from rlvr_lightning.modules.attention_kernels import turn_off_cudnn_attention  # noqa: E402

SHAPES = {  # the models' configs, random weights
    "smollm2": SMOLLM2_135M,
    "qwen2.5-1.5b": QWEN2_5_1_5B,
    "tiny": dict(
        model_type="llama",
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=256,
        vocab_size=1024,
        max_position_embeddings=1024,
    ),
}
STATIC_MODES = {"static": "none", "aot_eager": "aot_eager", "compiled": "default"}
STATIC_MODES.update({"reduce-overhead": "reduce-overhead", "compiled-forward": "compiled-forward"})
STATIC_MODES["cuda-graph"] = "cuda-graph"
VARIANTS = ("eager", *STATIC_MODES)
COLUMNS = (
    "model",
    "rows",
    "variant",
    "ms/step",
    "tok/s",
    "GB/s",
    "of peak",
    "compile s",
    "syncs/step",
    "launches",
    "same",
    "adjacent",
    "max dlp",
)


def build_model(name: str, dtype: torch.dtype, device: torch.device):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(**SHAPES[name], attn_implementation="sdpa")
    with torch.device(device):  # random weights drawn there (a CPU draws Qwen2.5-1.5B's in ~50 s, on one thread)
        return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


def peak_bandwidth(device: torch.device) -> float:
    """Bytes per second of a large copy on `device` (read + write), the best of a few."""
    numel = (1 << 28 if device.type == "cuda" else 1 << 25) // 4
    source, target = torch.empty(numel, device=device), torch.empty(numel, device=device)
    best = float("inf")
    for _ in range(5):
        started = clock(device)
        target.copy_(source)
        best = min(best, clock(device) - started)
    return 2 * source.numel() * source.element_size() / best


def clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class Case:
    """One model at one batch size: its prompts and the decoding of each variant."""

    def __init__(self, model, rows: int, args, device: torch.device) -> None:
        from rlvr_lightning.generation.loop import left_pad

        self.model, self.rows, self.args, self.device = model, rows, args, device
        generator = torch.Generator().manual_seed(rows)
        group = min(args.group, rows)
        vocab = model.config.vocab_size
        prompts = []
        for _ in range(rows // group):  # uneven prompt lengths: left padding
            length = int(torch.randint(args.prompt_tokens // 2, args.prompt_tokens + 1, (1,), generator=generator))
            prompts.append(torch.randint(1, vocab, (length,), generator=generator).tolist())
        ids, mask = left_pad(prompts, pad_id=0)
        self.ids, self.mask, self.n = ids.to(device), mask.to(device), group
        self.pools: dict = {}

    def decode(self, variant: str, new_tokens: int | None = None):
        """One generation (EOS excluded: every row decodes `--new-tokens` tokens, or `new_tokens`) from a fixed
        random stream."""
        from rlvr_lightning.generation.loop import generate
        from rlvr_lightning.generation.output import StopStringChecker
        from rlvr_lightning.generation.sampling_config import SamplingConfig
        from rlvr_lightning.generation.static_cache import WorkspacePool
        from rlvr_lightning.generation.static_generation import static_generate

        new = new_tokens or self.args.new_tokens
        sampling = SamplingConfig(max_new_tokens=new, min_new_tokens=new, temperature=1.0)
        torch.manual_seed(1)
        if self.device.type == "cuda":
            torch.cuda.manual_seed(1)
        common = dict(eos_token_ids=[0], pad_token_id=0, stop=StopStringChecker([], lambda rows: []))
        if variant == "eager":
            return generate(self.model, self.ids, self.mask, self.n, max_new_tokens=new, min_new_tokens=new, **common)
        pool = self.pools.setdefault(variant, WorkspacePool())
        with torch.no_grad():
            return static_generate(
                self.model,
                self.ids,
                self.mask,
                self.n,
                sampling,
                pool=pool,
                mode=STATIC_MODES[variant],
                sync_every=self.args.sync_every,
                **common,
            )

    def syncs_per_step(self, variant: str) -> str:
        if self.device.type != "cuda":
            return "-"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode(1)
            try:
                out = self.decode(variant)
            finally:
                torch.cuda.set_sync_debug_mode(0)
        syncs = sum("called a synchronizing CUDA operation" in str(w.message) for w in caught)
        return f"{syncs / out.steps:.2f}"

    def launches_per_step(self, variant: str) -> str:
        """Operations launched from Python per decoding step (`kernel_counter.py`), from two counted generations
        of different lengths (the prefill cancels out); `-` without `--count-launches`, or where the step runs in
        a compiled or captured graph (its kernels are not dispatched from Python)."""
        if not self.args.count_launches or variant not in ("eager", "static"):
            return "-"
        from kernel_counter import KernelCounter

        counted = []
        for new in (self.args.new_tokens // 2, self.args.new_tokens):
            with KernelCounter() as counter:
                out = self.decode(variant, new)
            counted.append((counter.ops.total(), out.steps))
        (short, short_steps), (long, long_steps) = counted
        return f"{(long - short) / max(long_steps - short_steps, 1):.0f}"

    def step_bytes(self, variant: str, out) -> float:
        """The weights once and the keys and values a step attends to, on average over the steps."""
        config, model = self.model.config, self.model
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        per_slot = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * model.dtype.itemsize
        prompt = self.ids.shape[1]
        if variant == "eager":
            slots = self.rows * (prompt + out.steps / 2)
        else:
            ws = next(iter(next(iter(self.pools[variant]._by_model.values()))[1].values()))
            slots = ws.rows * ws.capacity
        return weights + slots * per_slot


def measure_case(case: Case, variants: list[str], repeats: int, peak: float) -> list[list[str]]:
    """Each variant's first generation (compilation, capture, warm-up), then `repeats` rounds that run the
    variants in turn (machine load falls on all alike); the figures of each variant's median round. A variant
    that raises (a compiler error, out of memory) gets a row that says so, and the others still run."""
    first, failed = {}, {}
    runs: dict[str, list] = {variant: [] for variant in variants}
    for round_ in range(repeats + 1):
        for variant in [v for v in variants if v not in failed]:
            started, skips = clock(case.device), cuda_graph_skips()
            try:
                out = case.decode(variant)
            except Exception as error:  # noqa: BLE001 - reported in the variant's row; the table goes on
                failed[variant] = reported_failure(variant, error, case.device)
                continue
            if round_ == 0:
                first[variant] = clock(case.device) - started
                if cuda_graph_skips() > skips:  # its kernels then run launched from Python
                    print(f"# {case.rows} rows, {variant}: inductor skipped its CUDA graphs (its warning says why)")
            else:
                runs[variant].append(out)
    medians = {name: sorted(outs, key=decode_seconds)[len(outs) // 2] for name, outs in runs.items() if outs}
    reference = medians.get("eager")
    rows = []
    for name in variants:
        if name in medians:
            rows.append(figures(case, name, medians[name], first[name], reference, peak))
        else:
            rows.append([name, "failed", *["-"] * (len(COLUMNS) - 4)])
    return rows


def cuda_graph_skips() -> int:
    """The graphs inductor has run without CUDA graphs (`reduce-overhead`'s fallback: a warning says why)."""
    from torch._dynamo.utils import counters

    return counters["inductor"]["cudagraph_skips"]


def decode_seconds(out) -> float:
    return out.seconds - (out.prefill_seconds or 0.0)


def figures(case: Case, variant: str, out, first: float, reference, peak: float) -> list[str]:
    seconds = decode_seconds(out)
    step_ms = 1000 * seconds / max(out.steps, 1)
    achieved = case.step_bytes(variant, out) / (step_ms / 1000)
    same, adjacent, diff = "-", "-", "-"
    if reference is not None and variant != "eager":
        equal = (out.response_ids == reference.response_ids).all(-1)
        same = f"{int(equal.sum())} of {equal.numel()}"
        adjacent = str(adjacent_first_differences(out.response_ids, reference.response_ids))
        if equal.any():
            diff = f"{(out.log_probs - reference.log_probs)[equal].abs().max().item():.1e}"
    return [
        variant,
        f"{step_ms:.2f}",
        f"{case.rows * out.steps / seconds:.0f}",
        f"{achieved / 1e9:.1f}",
        f"{achieved / peak:.3f}",
        f"{max(first - out.seconds, 0.0):.1f}",
        case.syncs_per_step(variant),
        case.launches_per_step(variant),
        same,
        adjacent,
        diff,
    ]


def adjacent_first_differences(ids: torch.Tensor, reference: torch.Tensor) -> int:
    """Rows of `ids [B, T]` that differ from `reference`'s and whose first differing tokens are neighbouring ids.

    Sampling inverts the CDF over the vocabulary in id order (`categorical_from_uniform`), so a rounding difference
    in the probabilities moves a draw that falls next to a step of the CDF to the neighbouring token; a wrong
    distribution would move draws anywhere."""
    differs = ids != reference
    rows = differs.any(-1)
    first = differs.int().argmax(-1, keepdim=True)
    gap = (ids.gather(-1, first) - reference.gather(-1, first)).abs().squeeze(-1)
    return int((rows & (gap == 1)).sum())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", nargs="+", choices=list(SHAPES), default=None)
    parser.add_argument("--rows", nargs="+", type=int, default=None)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=None)
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--group", type=int, default=8, help="rows per distinct prompt (group sampling)")
    parser.add_argument("--sync-every", type=int, default=8)
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float64"], default=None)
    parser.add_argument("--threads", type=int, default=1, help="torch threads on a CPU")
    parser.add_argument(
        "--count-launches",
        action="store_true",
        help="count the operations a step launches from Python (eager and static: two more generations each)",
    )
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (median); default 1 on CUDA, 3 on CPU")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    turn_off_cudnn_attention(device)  # as fit does (modules/attention_kernels.py), so the kernels are fit's
    args.models = args.models or (["smollm2", "qwen2.5-1.5b"] if cuda else ["tiny"])
    args.rows = args.rows or ([64, 128] if cuda else [8, 16])
    args.variants = args.variants or (
        ["eager", "static", "reduce-overhead", "compiled-forward", "cuda-graph"]
        if cuda
        else ["eager", "static", "aot_eager"]
    )
    args.new_tokens = args.new_tokens or (64 if cuda else 32)
    args.repeats = args.repeats or (1 if cuda else 3)
    dtype = getattr(torch, args.dtype or ("bfloat16" if cuda else "float32"))
    if not cuda:
        torch.set_num_threads(args.threads)
    print(f"# {' '.join(sys.argv)}")
    print(f"# {datetime.datetime.now().isoformat(timespec='seconds')}, torch {torch.__version__}, {describe(device)}")
    peak = peak_bandwidth(device)
    print(f"# {dtype}, {args.new_tokens} new tokens, prompts of {args.prompt_tokens // 2}-{args.prompt_tokens} tokens,")
    print(
        f"# sync_every {args.sync_every}, median of {args.repeats} round(s), peak copy bandwidth {peak / 1e9:.0f} GB/s"
    )
    table = []
    print_row(COLUMNS)
    for name in args.models:
        started = time.perf_counter()
        model = build_model(name, dtype, device)
        for rows in args.rows:
            case = Case(model, rows, args, device)
            for cells in measure_case(case, args.variants, args.repeats, peak):
                table.append([name, str(rows), *cells])
                print_row(table[-1])  # as it is measured: a part cut short by its time limit keeps its rows
            for line in best_lines([row for row in table if row[:2] == [name, str(rows)]]):
                print(line, flush=True)
        del model
        print(f"# {name}: {time.perf_counter() - started:.0f} s")
    return 1 if any(row[3] == "failed" for row in table) else 0


WIDTHS = (12, 4, 15, 8, 7, 6, 7, 9, 10, 8, 10, 8, 7)


def print_row(cells) -> None:
    print("  ".join(cell.rjust(width) for cell, width in zip(cells, WIDTHS, strict=True)), flush=True)


def best_lines(rows: list[list[str]]) -> list[str]:
    """Per model and batch: the eager loop's ms/step beside the fastest static variant's."""
    lines = []
    for key in dict.fromkeys((row[0], row[1]) for row in rows):
        group = {row[2]: float(row[3]) for row in rows if (row[0], row[1]) == key and row[3] != "failed"}
        others = {name: ms for name, ms in group.items() if name != "eager"}
        if "eager" in group and others:
            name = min(others, key=others.get)
            ratio = group["eager"] / others[name]
            lines.append(
                f"# best: {key[0]} {key[1]} rows: eager {group['eager']:.2f} ms/step, {name} {others[name]:.2f}"
                f" ms/step ({ratio:.2f}x)"
            )
    return lines


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}"
    return f"CPU, {torch.get_num_threads()} thread(s)"


if __name__ == "__main__":
    sys.exit(main())

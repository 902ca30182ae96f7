#!/usr/bin/env python
"""Scoring speed of one micro-batch, side by side in one process: the forward (log-probs with autograd) and the
backward of `HFPolicy.token_log_probs` on SmolLM2-135M's shape with random weights (built from a config: nothing
is downloaded), for each way of running the rows:

* `padded`: the rows padded to the longest prompt + response (`packed_sequences` off);
* `packed-model`: one packed sequence, the model's own kernel (`packed_attention: model`; SDPA with
  transformers' block-diagonal mask from the restarting position ids);
* `packed-flex`: one packed sequence through FlexAttention with a block mask from the rows' boundaries
  (`packed_attention: flex`; on a CPU its reference stand-in, an expanded mask for SDPA);
* `shared`: the rows padded, each distinct prompt run once and its rows' responses on top of its key/value cache
  (`share_prompt_prefix`, the default for grouped rollouts on a CPU; off by default on a GPU).

Each in float32 and under bf16 autocast (`--dtypes`), with lean activations (the default: `lean_activations`'s
RMSNorm and SwiGLU forwards and the output layer through `linear_token_log_probs`) and, with `--plain` (the
default on CUDA), also without them (transformers' own layers and a full logits tensor: `-plain` variants, the
same weights), and with `--compiled` (the default on CUDA) through inductor-compiled decoder layers
(`compile_layers: default`, `-compiled` variants; `shared` passes a cache and runs them as written, so it has none).
The rows come in groups of `--group` that share
their prompt (a GRPO rollout), with uneven prompt and response lengths (uniform in [half, full] of `--prompt` and
[quarter, full] of `--response`); prefix sharing is off but in `shared`, so the others differ only in how
attention and padding are handled. After `--warmup` untimed passes (FlexAttention
compiles then), `--repeats` rounds run the variants in turn; per (dtype, variant) it prints the median forward and
backward ms (CUDA events; a host clock on a CPU), the attention implementation that ran (read from the model's
config as its decoder starts), the peak memory of the pass over the memory before it (CUDA only) and
the largest log-prob difference from `padded`; then each variant's forward + backward time over `packed-flex`'s.

    python scripts/bench_score.py --device cpu --tiny                   # a quick check of the script
    python scripts/bench_score.py --device cuda                         # 32 rows, prompts <= 256, responses <= 512
    python scripts/bench_score.py --device cpu --tiny --plain           # lean against plain activations
    python scripts/bench_score.py --device cpu --compiled --variants padded --dtypes fp32 --rows 8 --prompt 64 \
        --response 192                                                  # compiled layers on a CPU
    python scripts/bench_score.py --device cuda --rows 64 --dtypes bf16
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from bench_failures import reported_failure  # noqa: E402

from rlvr_lightning.demos.model_shapes import SMOLLM2_135M  # noqa: E402
from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config  # noqa: E402
from rlvr_lightning.modules.attention_kernels import turn_off_cudnn_attention  # noqa: E402
from rlvr_lightning.policies.hf import HFPolicy  # noqa: E402
from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions  # noqa: E402
from rlvr_lightning.rollout import Rollout  # noqa: E402
from rlvr_lightning.runtime.devices import set_compute_device  # noqa: E402

# SmolLM2's 9:3 heads, each 16 wide: the narrowest FlexAttention's CUDA kernel takes
TINY = tiny_llama_config(hidden_size=144, num_attention_heads=9, num_key_value_heads=3, vocab_size=320)
VARIANTS = {  # name: (packed_sequences, packed_attention, share_prompt_prefix)
    "padded": (False, "model", False),
    "packed-model": (True, "model", False),
    "packed-flex": (True, "flex", False),
    "shared": (False, "model", True),
}


def uneven_rollout(
    rows: int, prompt: int, response: int, vocab: int, device: torch.device, group: int = 1, seed: int = 0
):
    """Groups of `group` rows sharing a left-padded prompt of [prompt / 2, prompt] tokens, responses of
    [response / 4, response]."""
    g = torch.Generator().manual_seed(seed)
    groups = -(-rows // group)
    prompt_lengths = torch.randint(max(1, prompt // 2), prompt + 1, (groups,), generator=g)
    response_lengths = torch.randint(max(1, response // 4), response + 1, (rows,), generator=g)
    columns_p, columns_r = torch.arange(prompt), torch.arange(response)
    prompt_mask = (columns_p >= prompt - prompt_lengths[:, None]).long()
    response_mask = (columns_r < response_lengths[:, None]).float()
    prompt_ids = torch.randint(10, vocab, (groups, prompt), generator=g) * prompt_mask
    prompt_ids, prompt_mask = (
        prompt_ids.repeat_interleave(group, 0)[:rows],
        prompt_mask.repeat_interleave(group, 0)[:rows],
    )
    response_ids = torch.randint(10, vocab, (rows, response), generator=g) * response_mask.long()
    return Rollout(
        prompt_ids=prompt_ids.to(device),
        prompt_mask=prompt_mask.to(device),
        response_ids=response_ids.to(device),
        response_mask=response_mask.to(device),
        group_index=torch.arange(rows, device=device) // group,
        group_size=group,
        truncated=torch.zeros(rows, dtype=torch.bool, device=device),
    )


class Clock:
    """Milliseconds between `start` and `stop`: CUDA events on a GPU, the host clock elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def start(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def stop(self, started) -> float:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            event.synchronize()
            return started.elapsed_time(event)
        return (time.perf_counter() - started) * 1e3


def one_pass(policies, rollout, variant: str, autocast: torch.dtype | None, clock: Clock, kernels: list) -> dict:
    """Forward and backward of one micro-batch; their ms, the kernel that ran, the peak memory and the log-probs."""
    name, kind = variant, ""
    for suffix in ("-plain", "-compiled"):
        if variant.endswith(suffix):
            name, kind = variant.removesuffix(suffix), suffix[1:]
    policy = policies[kind]
    policy.packed_sequences, policy.packed_attention, policy.share_prompt_prefix = VARIANTS[name]
    policy.model.zero_grad(set_to_none=True)
    device = rollout.response_ids.device
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    kernels.clear()
    started = clock.start()
    with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
        log_probs, _ = policy.token_log_probs(rollout, 1.0)
    forward_ms = clock.stop(started)
    started = clock.start()
    (log_probs.sum() / rollout.response_mask.sum()).backward()
    backward_ms = clock.stop(started)
    peak = torch.cuda.max_memory_allocated() - before if device.type == "cuda" else None
    return dict(forward=forward_ms, backward=backward_ms, kernel=kernels[0], peak=peak, log_probs=log_probs.detach())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="a tiny model and micro-batch (a check of the script)")
    parser.add_argument("--rows", type=int, default=None, help="rows of the micro-batch (default 32; tiny 4)")
    parser.add_argument("--prompt", type=int, default=None, help="longest prompt (default 256; tiny 12)")
    parser.add_argument("--response", type=int, default=None, help="longest response (default 512; tiny 20)")
    parser.add_argument("--group", type=int, default=None, help="rows per prompt (default 8; tiny 2)")
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--plain", action=argparse.BooleanOptionalAction, default=None, help="default: on CUDA")
    parser.add_argument("--compiled", action=argparse.BooleanOptionalAction, default=None, help="default: on CUDA")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    plain = device.type == "cuda" if args.plain is None else args.plain
    turn_off_cudnn_attention(device)  # as fit does (modules/attention_kernels.py), so the kernels are fit's
    compiled = device.type == "cuda" if args.compiled is None else args.compiled
    rows = args.rows or (4 if args.tiny else 32)
    prompt, response = args.prompt or (12 if args.tiny else 256), args.response or (20 if args.tiny else 512)
    config = TINY if args.tiny else SMOLLM2_135M
    tokenizer = save_tiny_tokenizer(Path(tempfile.mkdtemp()) / "tokenizer")
    kernels: list[str] = []
    policies = {}
    kinds = {"": ("none", True), "plain": ("none", False), "compiled": ("default", True)}  # compile_layers, lean
    for kind, (compile_layers, lean) in kinds.items():
        if (kind == "plain" and not plain) or (kind == "compiled" and not compiled):
            continue
        torch.manual_seed(0)  # the same weights
        options = HFModelOptions(
            config=config, tokenizer=str(tokenizer), lean_activations=lean, compile_layers=compile_layers
        )
        policy = HFPolicy(model=options, generation=GenerationOptions(share_prompt_prefix=False))
        policy.to(device)
        set_compute_device(policy, device)
        decoder = policy.base_model.get_decoder()  # outside the compiled layers, which run no Python hooks
        decoder.register_forward_pre_hook(lambda module, args: kernels.append(module.config._attn_implementation))
        policies[kind] = policy
    variants = [*args.variants, *(f"{v}-{kind}" for kind in policies if kind for v in args.variants)]
    variants = [v for v in variants if v != "shared-compiled"]  # shared passes a cache: its layers run as written
    group = args.group or (2 if args.tiny else 8)
    rollout = uneven_rollout(rows, prompt, response, policy.hf_config.vocab_size, device, group)
    tokens = int(rollout.prompt_mask.sum() + rollout.response_mask.sum())
    print(
        f"# {datetime.date.today()} {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}, "
        f"torch {torch.__version__}; {'tiny' if args.tiny else 'SmolLM2-135M'} shape, random weights; {rows} rows, "
        f"{tokens} real tokens, padded to {rows} x {prompt + response}, groups of {group}"
    )
    clock = Clock(device)
    results, failed = {}, {}

    def attempt(dtype: str, variant: str, autocast) -> dict | None:
        """One pass; a variant that raises (a compiler error, out of memory) is reported and left out."""
        try:
            return one_pass(policies, rollout, variant, autocast, clock, kernels)
        except Exception as error:  # noqa: BLE001 - reported in the table; the other variants still run
            failed[dtype, variant] = reported_failure(f"{dtype} {variant}", error, device, width=200)
            return None

    for dtype in args.dtypes:
        autocast = torch.bfloat16 if dtype == "bf16" else None
        for variant in variants:
            started = time.perf_counter()
            for _ in range(args.warmup):
                if (dtype, variant) not in failed:
                    attempt(dtype, variant, autocast)
            print(f"# {dtype} {variant}: warm-up {time.perf_counter() - started:.1f} s", flush=True)
        passes = {variant: [] for variant in variants}
        for _ in range(args.repeats):
            for variant in [v for v in variants if (dtype, v) not in failed]:
                passes[variant].append(attempt(dtype, variant, autocast))
        for variant, runs in passes.items():
            if (dtype, variant) not in failed:
                results[dtype, variant] = runs
    print(f"{'dtype':5} {'variant':22} {'forward ms':>10} {'backward ms':>11} {'peak MiB':>9} {'max |dlp|':>9}  kernel")
    for (dtype, variant), runs in results.items():
        forward = statistics.median(r["forward"] for r in runs)
        backward = statistics.median(r["backward"] for r in runs)
        peak = "-" if runs[0]["peak"] is None else f"{max(r['peak'] for r in runs) / 2**20:.0f}"
        reference = results.get((dtype, "padded"))
        diff = "-" if reference is None else f"{(runs[0]['log_probs'] - reference[0]['log_probs']).abs().max():.1e}"
        print(f"{dtype:5} {variant:22} {forward:10.2f} {backward:11.2f} {peak:>9} {diff:>9}  {runs[0]['kernel']}")
    for dtype, variant in failed:
        print(f"{dtype:5} {variant:22} {'failed':>10} {'-':>11} {'-':>9} {'-':>9}  {failed[dtype, variant][:60]}")
    for dtype in args.dtypes:
        if (dtype, "packed-flex") not in results:
            continue
        ran = [v for v in variants if (dtype, v) in results]
        total = {v: statistics.median(r["forward"] + r["backward"] for r in results[dtype, v]) for v in ran}
        ratios = ", ".join(f"{v} {total[v] / total['packed-flex']:.2f}x" for v in ran if v != "packed-flex")
        print(f"# {dtype} forward + backward over packed-flex's: {ratios}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Where sampling time goes: one `HFPolicy.sample` of SmolLM2-135M-Instruct (fp32, one thread, EOS suppressed
so every completion has `--new-tokens` tokens) under `torch.profiler`, the operations' self CPU time grouped
into weight matrix products, attention, sampling, cache copies and the rest, plus the time outside torch
operations (Python, dispatch). The prompts are `scripts/bench_step.py`'s chat prompts.

    python scripts/profile_generation.py --prompts 8 --new-tokens 32              # our KV-cache loop
    .venv-vllm/bin/python scripts/profile_generation.py --prompts 8 --new-tokens 128 --engine vllm   # the vLLM engine

Compare the two in their own environments: the vLLM CPU environment pins an older transformers whose
attention copies grouped-query keys and values at every decoding step (see `bench_step.py`).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_step_cases  # noqa: E402

from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions, PromptOptions

GROUPS = {  # operator name -> group (vLLM's CPU kernels included)
    "matmul (weights)": ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "onednn_mm", "gemm"),
    "attention": ("scaled_dot_product", "flash_attention", "attention", "paged"),
    "sampling": ("softmax", "cumsum", "rand", "uniform_", "searchsorted", "gumbel", "topk", "sort", "multinomial"),
    "cache copies": (
        "aten::cat",
        "aten::copy_",
        "index_select",
        "aten::index",
        "slice_scatter",
        "aten::clone",
        "reshape_and_cache",
    ),
}


def group_of(name: str) -> str:
    lowered = name.lower()
    for group, keys in GROUPS.items():
        if any(key.lower() in lowered for key in keys):
            return group
    return "other operations"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8, choices=[2, 8])
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--engine", choices=["ours", "vllm"], default="ours")
    args = parser.parse_args()
    torch.set_num_threads(1)

    from torch.profiler import ProfilerActivity, profile

    from rlvr_lightning.generation.sampling_config import SamplingConfig
    from rlvr_lightning.policies.hf import HFPolicy
    from rlvr_lightning.runtime.timing import clock

    generation = None
    if args.engine == "vllm":
        from rlvr_lightning.policies import VLLMGeneration

        generation = VLLMGeneration(dtype="float32", kv_cache_memory_gib=1.0, max_model_len=512)
    policy = HFPolicy(
        model=HFModelOptions(
            name_or_path=str(bench_step_cases.smollm2_dir()), dtype="float32", attn_implementation="sdpa"
        ),
        prompt=PromptOptions(template="chat"),
        generation=GenerationOptions(min_new_tokens=args.new_tokens, backend=generation),
    )
    prompts = (bench_step_cases.SMOL_PROMPTS if args.prompts == 2 else bench_step_cases.SMOL_PROMPTS_8)[: args.prompts]
    batch = {"prompt": prompts, "metadata": [{}] * len(prompts)}
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=args.new_tokens)

    def sample() -> float:
        torch.manual_seed(0)
        started = clock(policy.device)
        policy.sample(batch, args.generations, sampling)
        return clock(policy.device) - started

    warm = sample()  # start-up (an engine's), allocations
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        wall = sample()
    groups: collections.Counter[str] = collections.Counter()
    for event in prof.key_averages():
        groups[group_of(event.key)] += event.self_cpu_time_total / 1e6
    inside = sum(groups.values())
    print(
        f"{args.engine}: {args.prompts} prompts x {args.generations} x {args.new_tokens} tokens; "
        f"first sample {warm:.2f} s, profiled sample {wall:.2f} s"
    )
    for group, seconds in [*groups.most_common(), ("outside torch operations", wall - inside)]:
        print(f"  {group:<26} {seconds:7.2f} s  {seconds / wall:6.1%}")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))


if __name__ == "__main__":
    main()

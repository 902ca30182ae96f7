#!/usr/bin/env python
"""Sampling speed and sampler/trainer mismatch of our KV-cache loop by sampling precision, SmolLM2-135M-Instruct.

Legs (fp32 master weights in every leg; the trainer's log-probs are always the fp32 forward's):

* `fp32`: `KVCacheGeneration(dtype="float32")`, the model as it is;
* `bf16_copy`: `KVCacheGeneration(dtype="bfloat16")`, a bf16 copy of the weights (what the option does);
* `bf16_autocast`: the model itself under `torch.autocast(dtype=bfloat16)`, every fp32 weight cast at every step
  (the alternative the copy was chosen over);
* `bf16_autocast_copy`: `KVCacheGeneration(dtype="auto")` under the same autocast (what `bf16-mixed` samples
  with): its autocast copy, the linear layers' weights in bf16, the same numbers as `bf16_autocast`;
* `bf16_copy_fp32_head`: `bf16_copy` of the same weights with `model.lm_head_fp32` (the copy's output layer, and
  so its logits, in float32): what part of the mismatch the output layer's precision makes (MiniMax-M1, ScaleRL).

Each round runs every leg once, interleaved, in one process with one torch thread; the script prints per leg
the median and spread (min-max) of the decoding tokens/s and CPU seconds, the one-off cost of the cast copy
and of a refresh, and the mismatch statistics of `train/mismatch/*` (k3 KL, IS weight max/mean) between the
sampling log-probs and the fp32 trainer's recomputation on the same tokens. EOS is suppressed so every row
has `--new-tokens` tokens; the prompts are `bench_step.py`'s chat prompts.

    python scripts/bench_sampling_precision.py --prompts 2 --new-tokens 32 --rounds 3
    python scripts/bench_sampling_precision.py --prompts 8 --new-tokens 128 --rounds 2 --json out.json

It also checks the CPU's bf16 support (`torch.backends.cpu.get_cpu_capability()`, the flags
avx512_bf16 / amx_bf16): without it a bf16 matrix product is emulated and slower than fp32.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_step_cases  # noqa: E402

from rlvr_lightning.generation.sampling_precision import SamplingWeights
from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions, PromptOptions

LEGS = ("fp32", "bf16_copy", "bf16_autocast", "bf16_autocast_copy", "bf16_copy_fp32_head")


class ModelItself(SamplingWeights):
    """Sampling from the model as it is, whatever autocast says (the `bf16_autocast` leg)."""

    def model_for(self, model, dtype):
        return model


def cpu_bf16_flags() -> list[str]:
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return []
    return sorted({f for f in flags if f in ("avx512_bf16", "amx_bf16", "amx_tile", "avx512f")})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=2, choices=[2, 8])
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--legs", nargs="+", choices=LEGS, default=list(LEGS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--model-dir",
        default=None,
        help="a SmolLM2 directory (default: rlvr-models'); without model.safetensors: random weights from its config",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from rlvr_lightning.core.importance_sampling import mismatch_stats
    from rlvr_lightning.generation.loop import KVCacheGeneration
    from rlvr_lightning.generation.sampling_config import SamplingConfig
    from rlvr_lightning.policies.hf import HFPolicy
    from rlvr_lightning.runtime.timing import clock

    model_dir = Path(args.model_dir) if args.model_dir else bench_step_cases.smollm2_dir()
    if (model_dir / "model.safetensors").exists():
        source = {"name_or_path": str(model_dir)}
    else:  # same shapes and speed, random weights (a machine without the checkpoint)
        torch.manual_seed(0)
        config = json.loads((model_dir / "config.json").read_text())
        source = {"config": config, "tokenizer": str(model_dir)}

    def build(**options):
        return HFPolicy(
            prompt=PromptOptions(template="chat"),
            model=HFModelOptions(dtype="float32", **source, **options),
            generation=GenerationOptions(min_new_tokens=args.new_tokens),
        ).to(args.device)

    policy = build()
    policies = dict.fromkeys(LEGS, policy)
    if "bf16_copy_fp32_head" in args.legs:
        policies["bf16_copy_fp32_head"] = build(lm_head_fp32=True)
        policies["bf16_copy_fp32_head"].model.load_state_dict(policy.model.state_dict())
    prompts = (bench_step_cases.SMOL_PROMPTS if args.prompts == 2 else bench_step_cases.SMOL_PROMPTS_8)[: args.prompts]
    batch = {"prompt": prompts, "metadata": [{}] * len(prompts)}
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.new_tokens)
    backends = {
        "fp32": KVCacheGeneration(dtype="float32"),
        "bf16_copy": KVCacheGeneration(dtype="bfloat16"),
        "bf16_autocast": KVCacheGeneration(dtype="auto"),
        "bf16_autocast_copy": KVCacheGeneration(dtype="auto"),
        "bf16_copy_fp32_head": KVCacheGeneration(dtype="bfloat16"),
    }
    backends["bf16_autocast"]._weights = ModelItself()
    device_type = torch.device(args.device).type

    # one-off costs of the copy: building it, and refreshing it after the weights changed
    started = time.perf_counter()
    backends["bf16_copy"]._weights.model_for(policy.model, torch.bfloat16)
    build_seconds = time.perf_counter() - started
    with torch.no_grad():
        policy.model.get_input_embeddings().weight.add_(0.0)  # bumps a version: the next use refreshes
    started = time.perf_counter()
    backends["bf16_copy"]._weights.model_for(policy.model, torch.bfloat16)
    refresh_seconds = time.perf_counter() - started

    results: dict[str, list[dict]] = {leg: [] for leg in args.legs}
    for round_index in range(args.rounds + 1):  # round 0 warms up
        for leg in args.legs:
            policy = policies[leg]
            policy.generation = backends[leg]
            precision = (
                torch.autocast(device_type, dtype=torch.bfloat16)
                if leg.startswith("bf16_autocast")
                else contextlib.nullcontext()
            )
            torch.manual_seed(round_index)
            cpu0, t0 = time.process_time(), clock(policy.device)
            with precision:
                rollout = policy.sample(batch, args.generations, sampling)
            wall, cpu = clock(policy.device) - t0, time.process_time() - cpu0
            tokens = float(rollout.response_mask.sum())
            with torch.no_grad():
                trainer, _ = policy.token_log_probs(rollout, temperature=sampling.temperature)
            stats = mismatch_stats(trainer, rollout.sampling_log_probs, rollout.response_mask)
            row = {"tokens_per_s": tokens / wall, "wall_s": wall, "cpu_s": cpu}
            row.update({key: float(value) for key, value in stats.items()})
            if round_index:
                results[leg].append(row)
            print(f"round {round_index} {leg:<18} {tokens / wall:8.1f} tok/s  k3 {row['k3_kl']:.2e}", flush=True)

    summary = {}
    for leg, rows in results.items():
        summary[leg] = {
            key: {
                "median": statistics.median(r[key] for r in rows),
                "min": min(r[key] for r in rows),
                "max": max(r[key] for r in rows),
            }
            for key in rows[0]
        }
    shape = f"{args.prompts} prompts x {args.generations} x {args.new_tokens} tokens"
    print(f"\nSmolLM2-135M, {shape}, {args.threads} thread(s), {args.rounds} rounds, device {args.device}")
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, flags {cpu_bf16_flags() or 'no bf16'}")
    if torch.cuda.is_available():
        print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"weights: {'random (config only)' if 'config' in source else model_dir}")
    print(f"bf16 copy: built in {build_seconds:.3f} s, refreshed in {refresh_seconds:.3f} s")
    print(f"{'leg':<18} {'tok/s median [min-max]':>26} {'cpu s':>8} {'k3 KL':>10} {'IS max':>8} {'IS mean':>8}")
    for leg, s in summary.items():
        tps = s["tokens_per_s"]
        print(
            f"{leg:<18} {tps['median']:9.1f} [{tps['min']:.1f}-{tps['max']:.1f}]".ljust(45)
            + f"{s['cpu_s']['median']:8.2f} {s['k3_kl']['median']:10.2e} {s['is_weight_max']['median']:8.3f}"
            f" {s['is_weight_mean']['median']:8.4f}"
        )
    if args.json:
        record = {"shape": shape, "build_s": build_seconds, "refresh_s": refresh_seconds, "summary": summary}
        Path(args.json).write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

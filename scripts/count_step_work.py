r"""What one GRPO step's scoring and update do, counted rather than timed: ours vs TRL's `GRPOTrainer`.

Runs `bench_step.py`'s legs on one of its cases (the same work on both sides: same model, prompts, responses of
exactly `new_tokens` tokens, one optimizer step) and, inside the sections it times (the log-prob forward with
gradients, the backward, the optimizer step), counts:

* `GFLOP`: floating-point operations of the matrix products and attention (`torch.utils.flop_counter`); what
  bounds a step on a GPU once its work is large;
* `kernels`: the aten operations that reach the device below autograd, views and allocations left out (on a GPU
  each launches at least one kernel, ~5-10 us from Python); what bounds a step when its work is small;
* `casts`: `_to_copy` operations among them (under autocast: the weights cast at every forward).

The counts do not depend on how busy the machine is, so a CPU shows what a change to the GPU path costs before a
GPU runs it. `--as-gpu` sizes the LM head's backward chunks as on a GPU (`core/log_probs.py`,
`BACKWARD_CHUNK_BYTES`) and resolves `share_prompt_prefix: null` as on a GPU (one forward per row), so `ours`
launches what it would launch there; the attention kernel and the lean norm stay the CPU's (packed scoring runs the
model's SDPA here, FlexAttention on a GPU; the norm's formulas here, torch's fused `rms_norm` on a GPU). The second
measured step is reported (the first can hold one-time work).

Legs: `ours` (the defaults), `plain` (lean activations off), `shared` (each group's prompt scored once, on any
device), `trl`.

    python scripts/count_step_work.py --case smollm2_long --as-gpu --legs shared ours trl
    python scripts/count_step_work.py --case smollm2_long --as-gpu --gpu-precision --top 12
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import warnings
from collections import Counter
from pathlib import Path

import torch
import transformers
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_step  # noqa: E402
import bench_step_trl  # noqa: E402
from bench_step_cases import CASES, StepTimer, make_tiny_model, smollm2_dir  # noqa: E402
from kernel_counter import KernelCounter  # noqa: E402

COUNTED = ("logprob_forward", "backward", "optimizer")
LEGS = ("ours", "plain", "shared", "trl")


class CountingTimer(StepTimer):
    """`StepTimer` that also counts FLOPs and kernels in the sections of `COUNTED` (per step, in `current`)."""

    def wrap(self, obj, attr: str, section: str) -> None:
        if section not in COUNTED:
            return super().wrap(obj, attr, section)
        fn = getattr(obj, attr)

        def counted(*args, **kwargs):
            flops, kernels = FlopCounterMode(display=False), KernelCounter()
            with flops, kernels:
                result = fn(*args, **kwargs)
            self.current[f"{section}_gflop"] += flops.get_total_flops() / 1e9
            self.current[f"{section}_kernels"] += kernels.ops.total()
            self.current[f"{section}_casts"] += kernels.ops["_to_copy"]
            for name, n in kernels.ops.items():
                self.current[f"op:{section}:{name}"] += n
            return result

        setattr(obj, attr, counted)


def worker(args) -> int:
    if args.as_gpu:
        from rlvr_lightning.core import log_probs
        from rlvr_lightning.policies import hf_scoring

        log_probs.CPU_BACKWARD_CHUNK_BYTES = log_probs.BACKWARD_CHUNK_BYTES
        hf_scoring.prefix_sharing_default = lambda device: False  # `share_prompt_prefix: null` as on a GPU
    bench_step.StepTimer = bench_step_trl.StepTimer = CountingTimer
    if args.worker == "shared":
        options = bench_step.GenerationOptions
        shared = lambda *a, **kw: dataclasses.replace(options(*a, **kw), share_prompt_prefix=True)  # noqa: E731
        bench_step.GenerationOptions = shared
    case = CASES[args.case]
    with tempfile.TemporaryDirectory(prefix="count_step_work-") as tmp:
        model_dir = make_tiny_model(Path(tmp) / "tiny") if args.case == "tiny" else smollm2_dir()
        if args.worker == "trl":
            timer = bench_step_trl.run_trl(model_dir, case, 2, args.seed, tmp, bf16=args.gpu_precision)
        else:
            precision = "bf16-mixed" if args.gpu_precision else "32-true"
            sampling = "auto" if args.gpu_precision else "float32"
            timer = bench_step.run_ours(
                model_dir, case, 2, args.seed, sampling_dtype=sampling, precision=precision,
                lean_activations=args.worker != "plain",
            )  # fmt: skip
    Path(args.json).write_text(json.dumps(timer.steps[-1]))
    return 0


def run_leg(leg: str, args, tmp: Path) -> dict:
    out = tmp / f"{leg}.json"
    command = [sys.executable, __file__, "--worker", leg, "--case", args.case, "--seed", str(args.seed)]
    command += ["--json", str(out), *(["--as-gpu"] if args.as_gpu else [])]
    command += ["--gpu-precision"] if args.gpu_precision else []
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def amount(step: dict, sections: tuple[str, ...], what: str) -> float:
    return sum(step.get(f"{section}_{what}", 0.0) for section in sections)


def report(steps: dict[str, dict], top: int) -> None:
    legs = list(steps)
    print(f"{'section':<16} {'count':<8} " + " ".join(f"{leg:>10}" for leg in legs))
    for label, sections in [*((s, (s,)) for s in COUNTED), ("total", COUNTED)]:
        for what in ("gflop", "kernels", "casts"):
            values = " ".join(f"{amount(step, sections, what):>10.1f}" for step in steps.values())
            print(f"{label:<16} {what:<8} {values}")
    for leg in [leg for leg in legs if leg != "trl" and "trl" in steps]:
        for what in ("gflop", "kernels"):
            ratio = amount(steps[leg], COUNTED[:2], what) / max(amount(steps["trl"], COUNTED[:2], what), 1e-9)
            print(f"{leg} / trl, forward + backward {what}: {ratio:.2f}x")
    for section in COUNTED[:2]:
        for leg, step in steps.items():
            ops = Counter({k.split(":")[2]: v for k, v in step.items() if k.startswith(f"op:{section}:")})
            listed = ", ".join(f"{name} {n:.0f}" for name, n in ops.most_common(top))
            print(f"{leg} {section}: {listed}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=[c for c in CASES if not CASES[c].get("natural_lengths")], default="tiny")
    parser.add_argument("--legs", nargs="+", choices=LEGS, default=["ours", "trl"])
    parser.add_argument(
        "--as-gpu", action="store_true", help="the LM head's backward chunks and prompt-prefix sharing as on a GPU"
    )
    parser.add_argument("--gpu-precision", action="store_true", help="ours bf16-mixed, TRL bf16=True (autocast)")
    parser.add_argument("--top", type=int, default=8, help="the most frequent kernels listed per leg and section")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the counts to this file")
    parser.add_argument("--worker", choices=LEGS, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.worker:
        warnings.filterwarnings("ignore")
        transformers.logging.set_verbosity_error()
        return worker(args)
    with tempfile.TemporaryDirectory(prefix="count_step_work-") as tmp:
        steps = {leg: run_leg(leg, args, Path(tmp)) for leg in args.legs}
    case = CASES[args.case]
    print(
        f"== {args.case}: {len(case['prompts'])} prompts x {case['generations']} x {case['new_tokens']} tokens, "
        f"{'bf16 autocast' if args.gpu_precision else 'fp32'}, LM head chunks as on a "
        f"{'GPU' if args.as_gpu else 'CPU'}; one step's counts"
    )
    report(steps, args.top)
    if args.json:
        Path(args.json).write_text(json.dumps(steps, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

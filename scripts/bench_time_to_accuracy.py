"""Held-out accuracy against wall clock: our `rlvr fit` and TRL's `GRPOTrainer` on the same SmolLM2 arithmetic
recipe (configs/smollm2_arithmetic.yaml: 2-digit sums, LoRA r=16 from the format warm-up, 4 prompts x 8
samples of at most 32 tokens a step, Dr. GRPO, token-mean PPO-clip, AdamW 5e-5, fp32, one torch thread).

    python scripts/bench_time_to_accuracy.py run --out runs/tta --seeds 0 --steps 40 --one_core
    python scripts/bench_time_to_accuracy.py report --out runs/tta --plot docs/figures/time_to_accuracy.png

`run` trains the format warm-up once (shared by every leg), then runs each seed's two legs at the same time,
each pinned to its own core (`taskset`; the machine should have no other load), or with `--one_core` one after
the other on core 0, and skips legs already done.
Each leg evaluates the same 100 held-out problems greedily (one evaluator, HF `generate`) at step 0 and every
`--eval_every` steps with its clock stopped (scripts/time_to_accuracy_legs.py). `report` prints a table and the
time-to-accuracy: the training seconds at which ours first reaches TRL's final held-out accuracy less one
standard error of that evaluation (sqrt(p (1 - p) / n): 4.6 points at 70% on 100 problems), as a fraction of TRL's
training seconds; and beside it the same for TRL's final accuracy itself, which one problem more or less in
either final evaluation can turn from a fraction into "never".

    python scripts/bench_time_to_accuracy.py distill --out runs/tta --teacher_seed 0 --seeds 0
    python scripts/bench_time_to_accuracy.py distill_report --out runs/tta --plot runs/tta/distill.png

`distill` takes our leg's final checkpoint of `--teacher_seed` (or the checkpoint `--teacher`) as the teacher and
runs on-policy distillation alone and mixed with GRPO (configs/smollm2_distill.yaml) from the same warm-up,
evaluated the same way; `distill_report` compares them with our GRPO leg by step and by training time.

`--legs` picks other legs (`ours ours_bf16`: bf16 sampling against fp32), and `--sequential` runs them one after
the other without pinning them to a core (as `scripts/learning_suite.py` runs its seeds). Commands on the same
`--out` wait for each other (a file lock), so several may share one teacher's directory.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEGS = ("ours", "trl")
DISTILL_LEGS = ("distill", "mixed")
NAMES = {
    "ours": "rlvr_lightning GRPO",
    "ours_bf16": "rlvr_lightning GRPO, bf16 sampling",
    "trl": "TRL GRPOTrainer",
    "distill": "on-policy distillation",
    "mixed": "distillation + GRPO",
}


def warm_up(out: Path) -> None:
    """The recipe's format warm-up (SFT, ~2 min), and its LoRA adapter as a PEFT directory for TRL's leg."""
    ckpt = out / "warmup" / "checkpoints" / "warmup" / "warmup.ckpt"
    if not ckpt.exists():
        (out / "warmup").mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable, "-m", "rlvr_lightning.cli", "fit",
            "--config", str(ROOT / "configs" / "smollm2_arithmetic_warmup.yaml"),
            "--data.init_args.train_file", str(ROOT / "configs" / "data" / "arithmetic_format_warmup.jsonl"),
            "--trainer.logger=false", "--trainer.enable_progress_bar=false",
        ]  # fmt: skip
        subprocess.run(command, cwd=out / "warmup", check=True)
    adapter = out / "warmup_adapter"
    if not (adapter / "adapter_config.json").exists():
        import yaml

        from rlvr_lightning.modules.policy_checkpoint import policy_from_checkpoint
        from rlvr_lightning.policies.hf import HFPolicy
        from rlvr_lightning.policies.hf_options import HFModelOptions, LoRAOptions, PromptOptions

        spec = yaml.safe_load((ROOT / "configs" / "smollm2_arithmetic.yaml").read_text())
        policy_args = spec["model"]["init_args"]["policy"]["init_args"]["policy"]["init_args"]
        groups = {"model": HFModelOptions, "lora": LoRAOptions, "prompt": PromptOptions}  # the recipe's groups
        policy = policy_from_checkpoint(HFPolicy(**{k: groups[k](**v) for k, v in policy_args.items()}), str(ckpt))
        policy.model.save_pretrained(str(adapter))


def done(path: Path, steps: int) -> bool:
    return path.exists() and json.loads(path.read_text())["points"][-1]["step"] >= steps


@contextlib.contextmanager
def holding(out: Path):
    """The directory's lock: commands on the same `--out` (a shared teacher) run one at a time."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def run_legs(args, legs: tuple[str, ...], extra: list[str] = ()) -> None:
    """Each seed's legs side by side, one per core (the first leg's core alternates with the seed); with
    `--one_core`, one after the other on core 0 (decoding reads memory: two legs side by side slow each other
    down, 2-3x on a 2-core machine); with `--sequential`, one after the other, not pinned."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "scripts")}
    one_core, sequential = getattr(args, "one_core", False), getattr(args, "sequential", False)
    for seed in args.seeds:
        running = []
        for core, leg in enumerate(legs if seed % 2 == 0 else legs[::-1]):
            core = 0 if one_core else core
            if done(args.out / f"{leg}_s{seed}.json", args.steps):
                continue
            pin = [] if sequential else ["taskset", "-c", str(core)]
            command = [
                *pin, sys.executable, str(ROOT / "scripts" / "time_to_accuracy_legs.py"), leg,
                "--out", str(args.out), "--seed", str(seed), "--steps", str(args.steps),
                "--eval_every", str(args.eval_every), "--num_eval", str(args.num_eval), *extra,
            ]  # fmt: skip
            log = open(args.out / f"{leg}_s{seed}.log", "w")
            running.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
            if (one_core or sequential) and running[-1].wait() != 0:
                raise SystemExit(f"a leg failed: {' '.join(command)} (see its log in {args.out})")
        for process in running:
            if process.wait() != 0:
                raise SystemExit(f"a leg failed: {' '.join(process.args)} (see its log in {args.out})")


def cmd_run(args) -> None:
    with holding(args.out):
        warm_up(args.out)
        run_legs(args, tuple(args.legs))
    cmd_report(args)


def cmd_distill(args) -> None:
    teacher = args.teacher or args.out / f"ours_s{args.teacher_seed}" / "checkpoints" / "final.ckpt"
    if not teacher.exists():
        if args.teacher:
            raise SystemExit(f"no teacher: --teacher {teacher} does not exist")
        raise SystemExit(f"no teacher: {teacher} is written by `run --seeds {args.teacher_seed}` (our leg)")
    with holding(args.out):
        warm_up(args.out)
        run_legs(args, tuple(args.legs), ["--teacher", str(teacher)])
    report_distill(args)


def load(out: Path) -> dict[tuple[str, int], dict]:
    runs = {}
    for path in sorted(out.glob("*_s[0-9]*.json")):
        leg, seed = path.stem.rsplit("_s", 1)
        runs[(leg, int(seed))] = json.loads(path.read_text())
    return runs


def standard_error(point: dict) -> float:
    """The binomial standard error of a held-out accuracy p on n problems: sqrt(p (1 - p) / n)."""
    problems = point.get("problems", 100)  # legs recorded before the count was stored ran the default 100
    return math.sqrt(point["accuracy"] * (1 - point["accuracy"]) / problems)


def time_to_accuracy(
    ours: dict, trl: dict, clock: str = "train_seconds", within: float = 0.0
) -> tuple[float, float | None]:
    """The target, TRL's final accuracy less `within` of its standard errors, and the fraction of TRL's training
    seconds (`clock`: wall or CPU) ours needed to first reach it (None: never)."""
    final = trl["points"][-1]
    target = final["accuracy"] - within * standard_error(final)
    reached = [p[clock] for p in ours["points"] if p["accuracy"] >= target]
    return target, (reached[0] / trl["points"][-1][clock]) if reached else None


def shown(fraction: float | None) -> str:
    return "never" if fraction is None else f"{fraction:.2f}x"


def median_step(run: dict) -> str:
    """The median seconds of a leg's steps; "-" for a leg still at its first evaluation."""
    return f"{statistics.median(run['step_seconds']):.2f}" if run["step_seconds"] else "-"


def cmd_report(args) -> None:
    runs = {key: run for key, run in load(args.out).items() if key[0] in (*LEGS, "ours_bf16")}
    print("| leg | seed | step 0 | final step | final accuracy | training min | median step s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for (leg, seed), run in sorted(runs.items()):
        first, last = run["points"][0], run["points"][-1]
        print(
            f"| {leg} | {seed} | {first['accuracy']:.0%} | {last['step']} | {last['accuracy']:.0%} "
            f"| {last['train_seconds'] / 60:.1f} | {median_step(run)} |"
        )
    for seed in sorted({seed for _, seed in runs}):
        if all(runs.get((leg, seed), {}).get("step_seconds") for leg in LEGS):
            ours, trl = runs[("ours", seed)], runs[("trl", seed)]
            final, fraction = time_to_accuracy(ours, trl)
            target, within = time_to_accuracy(ours, trl, within=1.0)
            steps = [statistics.median(runs[(leg, seed)]["step_seconds"]) for leg in LEGS]
            print(
                f"seed {seed}: TRL's final accuracy {final:.0%} less one standard error is {target:.1%}; ours reached "
                f"it after {shown(within)} TRL's training time, and {final:.0%} after {shown(fraction)}; "
                f"step time TRL / ours {steps[1] / steps[0]:.2f}x"
            )
            if all("train_cpu_seconds" in run["points"][-1] for run in (ours, trl)):
                cpu = [time_to_accuracy(ours, trl, "train_cpu_seconds", w)[1] for w in (1.0, 0.0)]
                print(f"seed {seed}: the same by CPU time: {shown(cpu[0])} and {shown(cpu[1])}")
    if args.plot:
        plot(runs, args.plot)


def report_distill(args) -> None:
    """GRPO (our leg of `run`), distillation and both mixed (or `--legs`): held-out accuracy by step and
    training time."""
    legs = getattr(args, "legs", None) or ("ours", *DISTILL_LEGS)
    runs = {key: run for key, run in load(args.out).items() if key[0] in legs}
    marks = sorted({p["step"] for run in runs.values() for p in run["points"]})
    print("| leg | seed | " + " | ".join(f"step {m}" for m in marks) + " | training min | median step s |")
    print("|---|---:|" + "---:|" * (len(marks) + 2))
    for (leg, seed), run in sorted(runs.items()):
        at = {p["step"]: p["accuracy"] for p in run["points"]}
        cells = " | ".join(f"{at[m]:.0%}" if m in at else "-" for m in marks)
        minutes = run["points"][-1]["train_seconds"] / 60
        print(f"| {NAMES[leg]} | {seed} | {cells} | {minutes:.1f} | {median_step(run)} |")
    if args.plot:
        plot(runs, args.plot, by_step=True)


def plot(runs: dict, path: str, by_step: bool = False) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2 if by_step else 1, figsize=(11 if by_step else 6.5, 4), squeeze=False)
    colours = {"ours": "tab:blue", "trl": "tab:orange", "distill": "tab:green", "mixed": "tab:red"}
    colours["ours_bf16"] = "tab:purple"
    for (leg, seed), run in sorted(runs.items()):
        accuracy = [100 * p["accuracy"] for p in run["points"]]
        label = f"{NAMES[leg]} (seed {seed})"
        style = {"marker": "o", "ms": 3, "color": colours[leg], "alpha": 1 - 0.3 * seed, "label": label}
        axes[0][0].plot([p["train_seconds"] / 60 for p in run["points"]], accuracy, **style)
        if by_step:
            axes[0][1].plot([p["step"] for p in run["points"]], accuracy, **style)
    axes[0][0].set_xlabel("minutes of training (one torch thread, evaluation excluded)")
    if by_step:
        axes[0][1].set_xlabel("rollout steps (4 prompts x 8 samples)")
    for ax in axes[0]:
        ax.set_ylabel("held-out greedy accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("SmolLM2-135M-Instruct, 2-digit addition, the same recipe and rollouts per step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(required=True)
    run = sub.add_parser("run", help="warm-up once, then both legs of each seed side by side")
    run.add_argument("--seeds", type=int, nargs="+", default=[0])
    run.add_argument("--legs", nargs="+", choices=("ours", "trl", "ours_bf16"), default=list(LEGS))
    run.set_defaults(fn=cmd_run)
    report = sub.add_parser("report", help="the table (and plot) of the finished legs")
    report.set_defaults(fn=cmd_report)
    distill = sub.add_parser("distill", help="distillation and distillation + GRPO from our leg's final checkpoint")
    distill.add_argument("--teacher_seed", type=int, default=0, help="the teacher: `run`'s our leg of this seed")
    distill.add_argument("--teacher", type=Path, default=None, help="the teacher's checkpoint instead")
    distill.add_argument("--seeds", type=int, nargs="+", default=[0])
    distill.add_argument("--legs", nargs="+", choices=DISTILL_LEGS, default=list(DISTILL_LEGS))
    distill.set_defaults(fn=cmd_distill)
    distill_report = sub.add_parser("distill_report", help="the table (and plot) of the distillation legs")
    distill_report.add_argument("--legs", nargs="+", choices=list(NAMES), default=None, help="these legs instead")
    distill_report.set_defaults(fn=report_distill)
    for command in (run, distill):
        command.add_argument("--steps", type=int, default=100, help="rollout steps of each leg")
        command.add_argument("--one_core", action="store_true", help="the legs one after the other on core 0")
        command.add_argument("--sequential", action="store_true", help="the legs one after the other, not pinned")
        command.add_argument("--eval_every", type=int, default=10)
        command.add_argument("--num_eval", type=int, default=100, help="held-out problems decoded greedily")
    for command in (run, report, distill, distill_report):
        command.add_argument("--out", type=Path, default=Path("runs/time_to_accuracy"))
        command.add_argument("--plot", default=None, help="write the curves to this PNG")
    args = parser.parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    main()

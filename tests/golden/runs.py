"""The golden runs: every shipped toy recipe on the sort task, and the length-bias configs' tiny language model
(configs/length_bias/), for a few rollout steps, seed 0, one thread, and the per-step metrics of its CSV log.

    python -m tests.golden.runs --out trajectories.json [NAME ...]   # in a process pinned by `pinned_environment`

Each run goes through `rlvr fit` in-process (`rlvr_lightning.cli.app`) in its own empty directory, so the
configs' relative paths (checkpoint folders, the SFT data file) land there. The process must be started with
`pinned_environment()`: torch and MKL choose their kernels by CPU (AVX-512 or AVX2, Intel or AMD), and
kernels of another instruction set give other last bits, which a few rollout steps turn into another
trajectory; pinned to AVX2 every x86-64 machine with AVX2 of one vendor computes the same numbers
(`cpu_vendor`: the machines of another vendor differ in MKL's last bits, and have their own golden files).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlvr_lightning.runtime.run_environment import PINNED_CPU_KERNELS

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "configs" / "recipes"
STEPS = 20  # rollout steps (SFT: optimizer steps; expert iteration: rounds, see EI_ROUNDS)
VAL_EVERY = 10
EI_ROUNDS = 4  # an expert-iteration round samples 8 responses to 512 prompts and fine-tunes 2 epochs on them
SFT_PAIRS = 200  # SFT: 200 pairs / 32 a batch = 7 steps an epoch, 3 epochs
PINNED = {
    **PINNED_CPU_KERNELS,  # the same numbers on every x86-64 machine with AVX2 of one vendor
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONHASHSEED": "0",
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
    "HF_HUB_OFFLINE": "1",
}
IGNORED_PREFIXES = ("time/",)  # wall-clock timings: the only columns that differ between identical runs,
IGNORED_SUFFIXES = ("_seconds", "/tokens_per_second")  # with the language models' generation timings


@dataclass(frozen=True)
class GoldenRun:
    name: str
    config: str  # relative to the repository
    overrides: tuple[str, ...] = ()

    def argv(self, workdir: Path) -> list[str]:
        logger = {
            "class_path": "lightning.pytorch.loggers.CSVLogger",
            "init_args": {"save_dir": str(workdir), "name": "csv", "version": 0},
        }
        return [
            "fit",
            "--config",
            str(ROOT / self.config),
            "--seed_everything=0",
            "--torch_threads=1",
            f"--trainer.logger={json.dumps(logger)}",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.default_root_dir={workdir}",
            *self.overrides,
        ]

    def command(self) -> str:
        """The run as a command line from the repository's root (the log and root directory left to `rlvr`'s
        defaults)."""
        overrides = [option.replace(f"{ROOT}{os.sep}", "") for option in self.overrides]
        return " ".join(["rlvr fit --config", self.config, "--seed_everything=0 --torch_threads=1", *overrides])


def _rollout_steps(steps: int) -> tuple[str, ...]:
    return (f"--trainer.limit_train_batches={steps}", f"--trainer.val_check_interval={VAL_EVERY}")


def golden_runs() -> list[GoldenRun]:
    """sort_lecture, sort_grpo, every RL recipe in configs/recipes, SFT and expert iteration, and the length-bias
    configs (GRPO, Dr. GRPO, GFPO, ΔL Normalization: a tiny Llama, the language-model path of sampling, scoring
    and update)."""
    runs = [GoldenRun(name, f"configs/{name}.yaml", _rollout_steps(STEPS)) for name in ("sort_lecture", "sort_grpo")]
    for path in sorted(RECIPES.glob("*.yaml")):
        if path.stem == "sft":
            overrides = ("--trainer.max_epochs=3", "--trainer.check_val_every_n_epoch=1")
        elif path.stem == "expert_iteration":
            overrides = (f"--trainer.limit_train_batches={EI_ROUNDS}", "--trainer.val_check_interval=2")
        else:
            overrides = _rollout_steps(STEPS)
        runs.append(GoldenRun(f"recipe_{path.stem}", f"configs/recipes/{path.stem}.yaml", overrides))
    # each run in a fresh directory: the configs' tokenizer, named relative to the repository, made absolute
    tokenizer = ROOT / "configs" / "length_bias" / "digits_tokenizer"
    for name in ("grpo", "dr_grpo", "gfpo", "delta_l"):
        overrides = (*_rollout_steps(STEPS), f"--model.init_args.policy.init_args.model.tokenizer={tokenizer}")
        runs.append(GoldenRun(f"length_bias_{name}", f"configs/length_bias/{name}.yaml", overrides))
    return runs


def write_sft_pairs(path: Path) -> None:
    """configs/recipes/sft.yaml's data file: pairs "prompt -> the prompt sorted" from the sort task's training
    stream, as scripts/sft_then_grpo.py's data stage writes them."""
    from rlvr_lightning.data import SortTask
    from rlvr_lightning.data.sft_data import write_jsonl

    stream = iter(SortTask(vocab_size=10, length=4, seed=0).train_dataset())
    write_jsonl([{"prompt": e["prompt"], "response": e["answer"]} for e in itertools.islice(stream, SFT_PAIRS)], path)


def read_metrics(path: Path) -> list[dict[str, float]]:
    """Every row of a Lightning CSV log: its non-empty cells (NaN stays NaN), timings left out."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    return [
        {
            k: float(v)
            for k, v in row.items()
            if v != "" and not k.startswith(IGNORED_PREFIXES) and not k.endswith(IGNORED_SUFFIXES)
        }
        for row in rows
    ]


def trajectory(run: GoldenRun) -> list[dict[str, float]]:
    """`run`'s per-step metrics, from a fresh directory."""
    from rlvr_lightning.cli import main

    with (
        tempfile.TemporaryDirectory(prefix=f"golden_{run.name}_") as tmp,
        contextlib.chdir(tmp),
    ):
        workdir = Path(tmp)
        if run.name == "recipe_sft":
            write_sft_pairs(workdir / "runs" / "sft_sort" / "train.jsonl")
        main(run.argv(workdir))
        return read_metrics(workdir / "csv" / "version_0" / "metrics.csv")


def cpu_capability() -> str:
    import torch

    return torch.backends.cpu.get_cpu_capability()


def cpu_vendor(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The folder of this CPU's golden files: "amd" or "intel" from /proc/cpuinfo's vendor_id ("AuthenticAMD",
    "GenuineIntel"), else that id lower-cased ("unknown" without one). Pinned to AVX2 and MKL's COMPATIBLE branch,
    one vendor's CPUs repeat each other's trajectories to the bit, but an AMD EPYC and an Intel Xeon, which agree on
    the first forward pass, differ in the last bits from the first update on, and a few rollout steps later the
    trajectories part."""
    try:
        lines = cpuinfo.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    vendor = next((v.strip() for k, _, v in (line.partition(":") for line in lines) if k.strip() == "vendor_id"), "")
    return {"AuthenticAMD": "amd", "GenuineIntel": "intel"}.get(vendor, vendor.lower() or "unknown")


def pinned_environment() -> dict[str, str]:
    """This process's environment with the kernels pinned and this checkout first on the path."""
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, **PINNED, "PYTHONPATH": path}


def run_pinned(names: list[str], out: Path, timeout: float = 900) -> dict:
    """Make the golden runs `names` (all when empty) in a fresh pinned process; their trajectories and the
    process's CPU capability and torch version. A failed run raises with the end of the process's output."""
    command = [sys.executable, "-m", "tests.golden.runs", "--out", str(out), *names]
    done = subprocess.run(
        command, cwd=ROOT, env=pinned_environment(), capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited with {done.returncode}:\n{done.stderr[-4000:]}")
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the golden runs; write their per-step metrics as JSON.")
    parser.add_argument("names", nargs="*", help="golden runs to make (default: all)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if any(os.environ.get(k) != v for k, v in PINNED.items()):
        parser.error(f"run in a process started with tests.golden.runs.pinned_environment() (needs {PINNED})")
    runs = {run.name: run for run in golden_runs()}
    unknown = sorted(set(args.names) - set(runs))
    if unknown:
        parser.error(f"unknown golden runs {unknown}; choose from {sorted(runs)}")
    sys.argv[1:] = []  # LightningCLI warns when it is given arguments beside sys.argv's
    import torch

    torch.set_num_threads(1)
    result = {
        "cpu_capability": cpu_capability(),
        "torch": torch.__version__,
        "runs": {name: trajectory(runs[name]) for name in (args.names or runs)},
    }
    args.out.write_text(json.dumps(result, allow_nan=True) + "\n")
    return 0


def same(golden: float, value: float, rtol: float, atol: float) -> bool:
    """Equal up to float noise: both NaN, or |value - golden| <= atol + rtol * |golden|."""
    if math.isnan(golden) or math.isnan(value):
        return math.isnan(golden) and math.isnan(value)
    return abs(value - golden) <= atol + rtol * abs(golden)


if __name__ == "__main__":
    sys.exit(main())

"""The examples of docs/extending.md, run as a user runs them.

Each example is one Python file and a YAML fragment under docs/examples/. A test copies them into a
temporary directory (outside the package), puts that directory on the import path and runs `rlvr fit` there
(the console script's own `main`, in this process: an interpreter start per example would double the time) on
a shipped config plus the fragment, for a few steps; then it reads the run's CSV metrics to check that the
extension was used.
"""

from __future__ import annotations

import csv
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples"
SORT = ROOT / "configs" / "sort_grpo.yaml"
TINY_LM = ROOT / "configs" / "length_bias" / "grpo.yaml"  # a 2-layer random Llama with a digit tokenizer
DIGITS_TOKENIZER = ROOT / "configs" / "length_bias" / "digits_tokenizer"

RUN_SETTINGS = """\
trainer:
  logger:
    class_path: lightning.pytorch.loggers.CSVLogger
    init_args: {save_dir: logs, name: run, flush_logs_every_n_steps: 1}
  limit_val_batches: 0
  enable_progress_bar: false
"""


def run_example(tmp_path: Path, files: list[str], configs: list[Path | str], *args: str) -> list[dict[str, str]]:
    """Copy `files` from docs/examples into `tmp_path`, run `rlvr fit` there; the rows of its metrics.csv."""
    for name in files:
        shutil.copy(EXAMPLES / name, tmp_path / name)
    (tmp_path / "run_settings.yaml").write_text(RUN_SETTINGS)
    command = ["fit"]
    for config in [*configs, "run_settings.yaml"]:
        command += ["--config", str(config)]
    modules = {Path(name).stem for name in files if name.endswith(".py")}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        patch.syspath_prepend(str(tmp_path))  # where the user's module is found, as on their PYTHONPATH
        patch.setenv("WANDB_MODE", "offline")
        patch.setenv("HF_HUB_OFFLINE", "1")
        for name in modules:  # the user's module from this directory, not one imported by an earlier example
            patch.delitem(sys.modules, name, raising=False)
        from rlvr_lightning.cli.app import main

        main([*command, *args])
        for name in modules:
            sys.modules.pop(name, None)
    (metrics_file,) = (tmp_path / "logs").rglob("metrics.csv")
    with metrics_file.open() as f:
        return [row for row in csv.DictReader(f) if row.get("train/reward_mean")]


def column(rows: list[dict[str, str]], name: str) -> list[float]:
    assert name in rows[0], f"no metric {name!r}; logged: {sorted(rows[0])}"
    return [float(row[name]) for row in rows if row[name] != ""]


def test_reward_example(tmp_path):
    rows = run_example(
        tmp_path, ["my_reward.py", "my_reward.yaml"], [SORT, "my_reward.yaml"], "--trainer.limit_train_batches=3"
    )
    assert len(rows) == 3
    values = column(rows, "train/rewards/starts_with_smallest")
    assert all(0.0 <= v <= 1.0 for v in values) and max(values) > 0
    # the total is the weighted sum: sort reward (weight 1) + 0.5 x this one
    sort, total = column(rows, "train/rewards/sort_inclusion_ordering"), column(rows, "train/reward_mean")
    assert total == pytest.approx([s + 0.5 * v for s, v in zip(sort, values, strict=True)], abs=1e-4)


def test_advantage_example(tmp_path):
    rows = run_example(
        tmp_path,
        ["my_advantage.py", "my_advantage.yaml"],
        [SORT, "my_advantage.yaml"],
        "--trainer.limit_train_batches=3",
    )
    # centred ranks in [-1, 1] over groups of 8: std at most sqrt(21)/7 = 0.655; GRPO's normalised advantages
    # (the base config's estimator) have a std near 1 on these groups, which dynamic sampling keeps non-constant
    assert all(0.1 < std <= 0.66 for std in column(rows, "train/advantage_std"))
    assert all(abs(mean) < 1e-5 for mean in column(rows, "train/advantage_mean"))


def test_loss_example(tmp_path):
    rows = run_example(
        tmp_path, ["my_loss.py", "my_loss.yaml"], [SORT, "my_loss.yaml"], "--trainer.limit_train_batches=3"
    )
    fractions = column(rows, "train/clamped_advantage_fraction")  # reported by the example's loss only
    assert all(0.0 <= f <= 1.0 for f in fractions) and max(fractions) > 0
    assert all(norm > 0 for norm in column(rows, "train/grad_norm"))  # every update moved the parameters
    assert all(skipped == 0 for skipped in column(rows, "train/skipped_updates"))


def test_kl_estimator_example(tmp_path):
    # a small learning rate: the policy stays near the reference (the base config's 3e-3 moves some sampled
    # tokens' log-probs by several nats within the first step, where k3's exponential exceeds |d|)
    steps = ("--trainer.limit_train_batches=2", "--model.init_args.optimizer.init_args.lr=1e-4")
    (tmp_path / "abs").mkdir()
    (tmp_path / "k3").mkdir()
    rows = run_example(tmp_path / "abs", ["my_kl.py", "my_kl.yaml"], [SORT, "my_kl.yaml"], *steps)
    k3_rows = run_example(
        tmp_path / "k3", ["my_kl.py", "my_kl.yaml"], [SORT, "my_kl.yaml"], *steps, "--model.init_args.kl.estimator=k3"
    )
    # same seed, same updates until the KL term first differs: |d| exceeds k3 = exp(d) - d - 1 for small moves
    abs_kl, k3_kl = column(rows, "train/kl"), column(k3_rows, "train/kl")
    assert all(a > 0 for a in abs_kl)
    assert abs_kl[0] > k3_kl[0]


def test_jsonl_task_example(tmp_path):
    rows = run_example(
        tmp_path,
        ["my_data.jsonl", "my_jsonl.yaml"],
        [TINY_LM, "my_jsonl.yaml"],
        f"--model.init_args.policy.init_args.model.tokenizer={DIGITS_TOKENIZER}",
        "--trainer.limit_train_batches=2",
        "--model.init_args.update.mini_batch_size=32",
    )
    # the file's prompts are 5 digits (the base config's sort task has 3), scored by the example's reward
    assert column(rows, "train/generation/prompt_length/mean") == [5.0, 5.0]
    assert all(0.0 <= v <= 1.0 for v in column(rows, "train/rewards/contains"))


def test_task_subclass_example(tmp_path):
    rows = run_example(
        tmp_path,
        ["my_task.py", "my_task.yaml", "my_data.csv"],
        [TINY_LM, "my_task.yaml"],
        f"--model.init_args.policy.init_args.model.tokenizer={DIGITS_TOKENIZER}",
        "--trainer.limit_train_batches=2",
        "--model.init_args.update.mini_batch_size=32",
    )
    assert column(rows, "train/generation/prompt_length/mean") == [5.0, 5.0]
    assert all(0.0 <= v <= 1.0 for v in column(rows, "train/rewards/contains"))


def test_generation_backend_example(tmp_path):
    rows = run_example(
        tmp_path,
        ["my_backend.py", "my_backend.yaml"],
        [TINY_LM, "my_backend.yaml"],
        f"--model.init_args.policy.init_args.model.tokenizer={DIGITS_TOKENIZER}",
        "--data.init_args.batch_size=4",
        "--trainer.limit_train_batches=2",
        "--model.init_args.update.mini_batch_size=32",
    )
    assert column(rows, "train/generation/transformers_generate_calls") == [1.0, 2.0]  # the backend sampled each step
    assert all(norm > 0 for norm in column(rows, "train/grad_norm"))

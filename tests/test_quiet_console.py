"""What a user sees on stderr running a shipped config (the sort recipe with W&B logging, the GSM8K recipe with a
tiny language model and a JSONL task): Lightning's few lines of information and nothing else, except the
messages docs/troubleshooting.md lists as harmless (other libraries' warnings are fixed at their source or
filtered, with a reason, in `rlvr_lightning/runtime/quiet_console.py`)."""

import os
import re
import subprocess
import sys
from pathlib import Path

from lightning.pytorch.loggers import WandbLogger

from rlvr_lightning.cli import main

from .gsm8k_tiny import write_tiny_gsm8k_override

ROOT = Path(__file__).resolve().parents[1]
LIGHTNING_INFO = [
    r"Seed set to \d+$",
    r"GPU available: ",
    r"TPU available: ",
    r"`Trainer\.fit` stopped: ",
    r"Using bfloat16 Automatic Mixed Precision \(AMP\)$",
    r"`Trainer\((limit_train_batches|limit_val_batches|val_check_interval)=\d+\)` was configured so ",
]


def unexplained_lines(*args: str) -> list[str]:
    """The lines `rlvr ARGS` writes to stderr that are neither Lightning's information nor documented as harmless."""
    script = "import sys; from rlvr_lightning.cli import entry_point; sys.argv[0] = 'rlvr'; sys.exit(entry_point())"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "RLVR_DEBUG")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    documented = (ROOT / "docs" / "troubleshooting.md").read_text()
    unexplained = [
        line
        for line in done.stderr.splitlines()
        if line.strip()
        and not any(re.match(pattern, line) for pattern in LIGHTNING_INFO)
        and f"`{line[:40]}" not in documented
    ]
    return unexplained


def test_the_sort_recipe_prints_no_third_party_warnings(in_tmp_dir):
    recipe = str(ROOT / "configs" / "sort_grpo.yaml")
    assert unexplained_lines("fit", "--config", recipe, "--trainer.limit_train_batches", "2") == []


def test_a_language_model_run_with_a_jsonl_task_prints_no_third_party_warnings(in_tmp_dir):
    tiny = str(write_tiny_gsm8k_override(in_tmp_dir, accelerator="cpu"))
    recipe = str(ROOT / "configs" / "gsm8k_qwen2.5_math_1.5b.yaml")
    assert unexplained_lines("fit", "--config", recipe, "--config", tiny) == []


def test_the_wandb_logger_passes_no_anonymous_setting_to_wandb():
    """Lightning's WandbLogger passes `anonymous=None`, which W&B answers with a deprecation warning on every run."""
    cli = main(["--config", str(ROOT / "configs" / "sort_grpo.yaml"), "--trainer.enable_progress_bar=false"], run=False)
    (wandb_logger,) = [logger for logger in cli.trainer.loggers if isinstance(logger, WandbLogger)]
    assert "anonymous" not in wandb_logger._wandb_init

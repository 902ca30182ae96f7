"""scripts/train_smollm2_arithmetic.sh runs its stages inside RUN_DIR, so it makes the files its arguments name by a
relative path (--config, --ckpt_path) absolute first; other arguments pass through as given. A stand-in Python
prints the command each stage would run."""

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_relative_config_and_checkpoint_paths_reach_the_run_as_absolute_ones(tmp_path):
    python = tmp_path / "python"
    python.write_text('#!/usr/bin/env bash\necho "ARGS: $*"\n')
    python.chmod(0o755)
    (tmp_path / "mine.yaml").write_text("seed_everything: 3\n")
    (tmp_path / "final.ckpt").write_bytes(b"")
    args = ["--config", "mine.yaml", "--ckpt_path=final.ckpt", "--ckpt_path", "last", "--run_name", "mine.yaml"]
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "train_smollm2_arithmetic.sh"), "run", "--seed_everything", "1", *args],
        cwd=tmp_path, env={**os.environ, "PYTHON": str(python)}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    warmup, rl = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("ARGS: ")]
    assert warmup[-2:] == ["--seed_everything", "1"]  # the seed reaches the warm-up too
    assert rl[-9:] == [
        "--seed_everything", "1", "--config", str(tmp_path / "mine.yaml"), f"--ckpt_path={tmp_path / 'final.ckpt'}",
        "--ckpt_path", "last", "--run_name", "mine.yaml",  # not a file option: left as given
    ]  # fmt: skip
    assert (tmp_path / "run" / "logging_csv.yaml").is_file()

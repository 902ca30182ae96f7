"""The `rlvr` command: every shipped config parses, and a config runs end to end."""

import subprocess
import sys
from pathlib import Path

import pytest

from rlvr_lightning.cli import main

# configs/gpu/ holds overlays of the GSM8K recipe, parsed on top of it by tests/test_gpu_recipes.py
CONFIGS = sorted(p for p in (Path(__file__).resolve().parents[1] / "configs").rglob("*.yaml") if p.parent.name != "gpu")
QUICK = [
    "--trainer.limit_train_batches=3",
    "--trainer.limit_val_batches=1",
    "--trainer.val_check_interval=3",
    "--trainer.logger=false",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_checkpointing=false",
]


@pytest.mark.parametrize("config", CONFIGS, ids=[c.name for c in CONFIGS])
def test_print_config(config, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(config), "--print_config"])
    assert exit_info.value.code in (0, None)
    assert "class_path" in capsys.readouterr().out


def test_sort_lecture_runs_end_to_end(in_tmp_dir):
    cli = main(["fit", "--config", str(CONFIGS[0].parent / "sort_lecture.yaml"), *QUICK])
    metrics = cli.trainer.callback_metrics
    assert {"train/reward_mean", "train/kl", "val/accuracy"} <= set(metrics)
    assert cli.trainer.fit_loop.epoch_loop._batches_that_stepped == 3
    assert cli.trainer.global_step == 3 * 4  # four inner epochs: optimizer steps


def test_the_console_script_exits_with_status_zero_after_a_run(in_tmp_dir):
    # `rlvr` as installed: [project.scripts] calls the entry point and exits with what it returns
    script = "import sys; from rlvr_lightning.cli import entry_point; sys.argv[0] = 'rlvr'; sys.exit(entry_point())"
    config = str(CONFIGS[0].parent / "sort_lecture.yaml")
    done = subprocess.run(
        [sys.executable, "-c", script, "fit", "--config", config, *QUICK, "--trainer.limit_train_batches=1"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_default_loggers_write_wandb_offline_and_csv(in_tmp_dir):
    cli = main(["fit", "--config", str(CONFIGS[0].parent / "sort_grpo.yaml"), "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=0"])
    assert [type(logger).__name__ for logger in cli.trainer.loggers] == ["WandbLogger", "CSVLogger"]
    csv_files = list(Path("runs/csv").rglob("metrics.csv"))
    assert csv_files and "train/reward_mean" in csv_files[0].read_text()
    assert list(Path("runs/wandb").glob("offline-run-*"))


def test_wrong_option_names_the_valid_choices(in_tmp_dir):
    with pytest.raises(ValueError, match="loss='ppo' is not valid; choose one of .*'ppo_clip'"):
        main(["fit", "--config", str(CONFIGS[0].parent / "sort_grpo.yaml"), "--model.init_args.loss=ppo", *QUICK])

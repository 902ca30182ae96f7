"""The `rlvr` command: every shipped config parses, and a config runs end to end."""

import subprocess
import sys
from pathlib import Path

import pytest

from rlvr_lightning.cli import main

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").rglob("*.yaml"))
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


def test_predict_writes_the_checkpoint_completions_and_validate_scores_them(in_tmp_dir):
    """`rlvr predict --ckpt_path` writes one JSON line per held-out prompt, decoded greedily by the checkpoint's
    policy; `rlvr validate --ckpt_path` reports the accuracy of exactly those completions."""
    import json

    from rlvr_lightning.policies.base import SamplingConfig

    config = str(CONFIGS[0].parent / "sort_lecture.yaml")
    fitted = main(["fit", "--config", config, *QUICK, "--trainer.limit_train_batches=2"])
    fitted.trainer.save_checkpoint("trained.ckpt")
    args = ["--config", config, "--trainer.logger=false", "--trainer.enable_progress_bar=false", "--ckpt_path", "trained.ckpt"]
    main(["predict", *args])
    rows = [json.loads(line) for line in Path("runs/predictions.jsonl").read_text().splitlines()]
    prompts = [row["prompt"] for row in rows]
    assert len(rows) == 256 and set(rows[0]) == {"prompt", "completion", "reward", "rewards", "correct", "truncated", "metadata"}
    greedy = fitted.model.policy.sample({"prompt": prompts}, 1, SamplingConfig(do_sample=False))
    assert [row["completion"] for row in rows] == greedy.response_ids.tolist()
    assert all(row["correct"] == (row["completion"] == sorted(row["prompt"])) for row in rows)
    validated = main(["validate", *args])
    accuracy = validated.trainer.callback_metrics["val/accuracy"].item()
    assert accuracy == pytest.approx(sum(row["correct"] for row in rows) / len(rows))


def test_there_is_no_test_command():
    from rlvr_lightning.cli import RLVRCLI

    assert set(RLVRCLI.subcommands()) == {"fit", "validate", "predict"}

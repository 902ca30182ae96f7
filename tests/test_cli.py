"""The `rlvr` command: every shipped config parses, and a config runs end to end."""

import subprocess
import sys
from pathlib import Path

import pytest

from rlvr_lightning.cli.app import main

# configs/gpu/ holds overlays of the GSM8K recipe, parsed on top of it by tests/test_gpu_recipes.py
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
CONFIGS = sorted(p for p in CONFIG_DIR.rglob("*.yaml") if p.parent.name != "gpu")
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
    cli = main(["fit", "--config", str(CONFIG_DIR / "sort_lecture.yaml"), *QUICK])
    metrics = cli.trainer.callback_metrics
    assert {"train/reward_mean", "train/kl", "val/accuracy"} <= set(metrics)
    assert cli.trainer.fit_loop.epoch_loop._batches_that_stepped == 3
    assert cli.trainer.global_step == 3 * 4  # four inner epochs: optimizer steps


def test_the_console_script_exits_with_status_zero_after_a_run(in_tmp_dir):
    # `rlvr` as installed: [project.scripts] calls the entry point and exits with what it returns
    script = "import sys; from rlvr_lightning.cli.app import entry_point; sys.argv[0] = 'rlvr'; sys.exit(entry_point())"
    config = str(CONFIG_DIR / "sort_lecture.yaml")
    done = subprocess.run(
        [sys.executable, "-c", script, "fit", "--config", config, *QUICK, "--trainer.limit_train_batches=1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_default_loggers_write_wandb_offline_and_csv(in_tmp_dir):
    cli = main(
        [
            "fit",
            "--config",
            str(CONFIG_DIR / "sort_grpo.yaml"),
            "--trainer.limit_train_batches=2",
            "--trainer.limit_val_batches=0",
        ]
    )
    assert [type(logger).__name__ for logger in cli.trainer.loggers] == ["WandbLogger", "CSVLogger"]
    csv_files = list(Path("runs/csv").rglob("metrics.csv"))
    assert csv_files and "train/reward_mean" in csv_files[0].read_text()
    assert list(Path("runs/wandb").glob("offline-run-*"))


def test_wrong_option_names_the_valid_choices(in_tmp_dir):
    with pytest.raises(ValueError, match="loss='ppo' is not valid; choose one of .*'ppo_clip'"):
        main(["fit", "--config", str(CONFIG_DIR / "sort_grpo.yaml"), "--model.init_args.loss=ppo", *QUICK])


def test_a_single_callback_is_accepted(in_tmp_dir):
    # `--trainer.callbacks=<one class>` gives one Callback, not a list (Lightning's Trainer accepts both)
    cli = main(
        [
            "fit",
            "--config",
            str(CONFIG_DIR / "sort_grpo.yaml"),
            "--trainer.callbacks=rlvr_lightning.rewards.SortInclusionOrderingReward",
            *QUICK[:2],
            "--trainer.limit_train_batches=1",
            "--trainer.logger=false",
            "--trainer.enable_checkpointing=false",
        ]
    )
    names = [type(cb).__name__ for cb in cli.trainer.callbacks]
    assert "SortInclusionOrderingReward" in names and "RewardProgressBar" in names
    assert cli.trainer.fit_loop.epoch_loop._batches_that_stepped == 1


def test_predict_writes_the_checkpoint_completions_and_validate_scores_them(in_tmp_dir):
    """`rlvr predict --ckpt_path` writes one JSON line per held-out prompt, decoded greedily by the checkpoint's
    policy; `rlvr validate --ckpt_path` reports the accuracy of exactly those completions."""
    import json

    from rlvr_lightning.generation.sampling_config import SamplingConfig

    config = str(CONFIG_DIR / "sort_lecture.yaml")
    fitted = main(["fit", "--config", config, *QUICK, "--trainer.limit_train_batches=2"])
    fitted.trainer.save_checkpoint("trained.ckpt")
    args = [
        "--config",
        config,
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
        "--ckpt_path",
        "trained.ckpt",
    ]
    main(["predict", *args])
    rows = [json.loads(line) for line in Path("runs/predictions.jsonl").read_text().splitlines()]
    prompts = [row["prompt"] for row in rows]
    assert len(rows) == 256 and set(rows[0]) == {
        "prompt",
        "completion",
        "reward",
        "rewards",
        "correct",
        "truncated",
        "metadata",
    }
    greedy = fitted.model.policy.sample({"prompt": prompts}, 1, SamplingConfig(do_sample=False))
    assert [row["completion"] for row in rows] == greedy.response_ids.tolist()
    assert all(row["correct"] == (row["completion"] == sorted(row["prompt"])) for row in rows)
    validated = main(["validate", *args])
    accuracy = validated.trainer.callback_metrics["val/accuracy"].item()
    assert accuracy == pytest.approx(sum(row["correct"] for row in rows) / len(rows))


def test_there_is_no_test_command():
    from rlvr_lightning.cli.app import RLVRCLI

    assert set(RLVRCLI.subcommands()) == {"fit", "validate", "predict", "eval"}


def test_torch_runs_on_one_thread_unless_the_config_says_otherwise(in_tmp_dir):
    import torch
    import yaml

    config = yaml.safe_load((CONFIG_DIR / "sort_lecture.yaml").read_text())
    del config["torch_threads"]
    Path("no_threads.yaml").write_text(yaml.safe_dump(config))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        main(["--config", "no_threads.yaml"], run=False)
        assert torch.get_num_threads() == 1  # the measured default (docs/benchmarks.md, "Threads")
        torch.set_num_threads(2)
        main(["--config", "no_threads.yaml", "--torch_threads", "null"], run=False)
        assert torch.get_num_threads() == 2  # null: torch's own setting is left alone
    finally:
        torch.set_num_threads(before)


def test_sort_ddp_is_sort_grpo_on_two_processes():
    """Same algorithm and global batch: only the per-rank sizes and the trainer's strategy differ."""
    import yaml

    grpo, ddp = (yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text()) for name in ("sort_grpo", "sort_ddp"))
    devices = ddp["trainer"]["devices"]
    assert ddp["trainer"]["strategy"] == "ddp" and devices == 2
    grpo_model, ddp_model = grpo["model"]["init_args"], ddp["model"]["init_args"]
    assert ddp_model["update"].pop("mini_batch_size") * devices == grpo_model["update"].pop("mini_batch_size")
    assert ddp_model == grpo_model  # dynamic sampling included
    assert ddp["data"]["init_args"].pop("batch_size") * devices == grpo["data"]["init_args"].pop("batch_size")
    assert ddp["data"] == grpo["data"]


def test_default_csv_log_is_on_disk_after_every_step(in_tmp_dir):
    """A run killed at any step boundary keeps the metrics of the steps before it."""
    import lightning.pytorch as pl

    on_disk = []

    class ReadCsv(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            files = list(Path("runs/csv").rglob("metrics.csv"))
            on_disk.append(files[0].read_text().count("\n") - 1 if files else 0)  # rows written so far

    cli = main(
        [
            "--config",
            str(CONFIG_DIR / "sort_lecture.yaml"),
            "--trainer.limit_train_batches=4",
            "--trainer.limit_val_batches=0",
            "--trainer.enable_progress_bar=false",
        ],
        run=False,
    )
    cli.trainer.callbacks.append(ReadCsv())
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert on_disk == [0, 1, 2, 3]


def test_trainer_counts_parse_as_counts_whatever_order_typing_cached(in_tmp_dir):
    """typing caches equal unions as one object, so an earlier `Optional[Union[float, int]]` (Lightning's own
    fabric.py has one) can become the Trainer's `Optional[Union[int, float]]`, and jsonargparse, which tries the
    members in order, would read `limit_train_batches: 1` as 1.0 (all the batches). A fresh process: parsers
    built earlier in this one may hold the members' order they saw."""
    recipe = Path(__file__).resolve().parents[1] / "configs" / "sort_grpo.yaml"
    code = f"""
import typing
import lightning.pytorch as pl
from rlvr_lightning.cli.app import COUNT_OR_FRACTION, main, parse_counts_as_counts
for name in COUNT_OR_FRACTION:
    pl.Trainer.__init__.__annotations__[name] = typing.Union[float, int, None]  # as the cache can hand them out
parse_counts_as_counts()
cli = main(["--config", {str(recipe)!r}, "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=0.5",
            "--trainer.val_check_interval=3", "--trainer.logger=false"], run=False)
print(repr((cli.trainer.limit_train_batches, cli.trainer.limit_val_batches, cli.trainer.val_check_interval)))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "(1, 0.5, 3)"

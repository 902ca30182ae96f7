"""configs/reasoning_gym_toy.yaml runs through `rlvr fit`: per-dataset reward and accuracy in training and
validation, the curriculum's per-dataset pass rates and levels at every refresh."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from rlvr_lightning.cli.app import main  # noqa: I001
from tests.envs import rg_support  # noqa: F401  (skips the module without reasoning-gym)

ROOT = Path(__file__).resolve().parents[2]
DATASETS = ("basic_arithmetic", "leg_counting")


def test_the_toy_config_trains_with_per_dataset_metrics_and_the_curriculum(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the config names its tokenizer relative to the repository
    cli = main(
        [
            "fit",
            "--config",
            str(ROOT / "configs" / "reasoning_gym_toy.yaml"),
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
            f"--trainer.logger.save_dir={tmp_path}",
            "--trainer.logger.name=csv",
        ]
    )
    assert cli.trainer.global_step == 4
    with open(next(tmp_path.glob("csv/*/metrics.csv"))) as handle:
        rows = list(csv.DictReader(handle))
    logged = {key for row in rows for key, value in row.items() if value}
    for name in DATASETS:
        assert f"curriculum/{name}/level" in logged and f"curriculum/{name}/pass_rate" in logged
        assert f"val/reasoning_gym/{name}/accuracy" in logged
    assert any(f"train/reasoning_gym/{name}/reward" in logged for name in DATASETS)
    refreshes = [row for row in rows if row.get("curriculum/refresh")]
    assert [float(row["curriculum/refresh"]) for row in refreshes] == [1.0, 2.0]
    assert cli.datamodule.state_dict()["task"]["levels"].keys() == set(DATASETS)


def test_eval_reports_each_dataset_s_held_out_accuracy(tmp_path, monkeypatch):
    import json

    monkeypatch.chdir(ROOT)
    output = tmp_path / "eval.json"
    main(
        [
            "eval",
            "--config",
            str(ROOT / "configs" / "reasoning_gym_toy.yaml"),
            "--trainer.enable_progress_bar=false",
            "--trainer.logger=false",
            f"--trainer.default_root_dir={tmp_path}",
            "--data.init_args.task.init_args.num_val=12",
            "--trainer.limit_val_batches=3",
            f"--eval.output={output}",
        ]
    )
    report = json.loads(output.read_text())
    accuracies = [report[f"reasoning_gym/{name}/accuracy"] for name in DATASETS]
    assert report["prompts"] == 24 and all(0 <= value <= 1 for value in accuracies)
    # the recipe's task reward is the reasoning-gym reward: its accuracy is the datasets' accuracies, weighted
    assert min(accuracies) <= report["accuracy"] <= max(accuracies)


def _smollm2_fetched() -> bool:
    from rlvr_lightning.runtime.model_cache import is_fetched

    return is_fetched("smollm2-135m-instruct")


@pytest.mark.skipif(not _smollm2_fetched(), reason="smollm2-135m-instruct not fetched (rlvr-models fetch ...)")
def test_the_smollm2_config_runs_a_step_and_checkpoints(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = main(
        [
            "fit",
            "--config",
            str(ROOT / "configs" / "reasoning_gym_smollm2.yaml"),
            "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=2",
            "--trainer.limit_val_batches=0",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.logger=false",
            "--model.init_args.group_size=2",
            "--model.init_args.sampling.max_new_tokens=4",
            "--data.init_args.batch_size=1",
            "--data.init_args.task.init_args.num_val=1",
            "--data.init_args.difficulty_filter.init_args.n=2",
            "--data.init_args.difficulty_filter.init_args.max_candidates=3",
            "--data.init_args.difficulty_filter.init_args.min_kept=1",
        ]
    )
    assert cli.trainer.global_step == 2
    assert list(tmp_path.glob("*/checkpoints/last.ckpt")), "the config's checkpoint callback wrote last.ckpt"

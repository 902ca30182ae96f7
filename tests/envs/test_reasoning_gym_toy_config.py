"""configs/reasoning_gym_toy.yaml runs through `rlvr fit`: per-dataset reward and accuracy in training and
validation, the curriculum's per-dataset pass rates and levels at every refresh."""

from __future__ import annotations

import csv
from pathlib import Path

from rlvr_lightning.cli import main  # noqa: I001
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

"""Runs the README's "Adding a reward" example exactly as written."""

import re
import sys
from pathlib import Path

from rlvr_lightning.cli import main

ROOT = Path(__file__).resolve().parents[1]


def readme_block(marker: str, language: str) -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"<!-- {marker} -->\s*```{language}\n(.*?)```", text, re.S)
    assert match, f"README has no {marker} block"
    return match.group(1)


def test_readme_reward_example_runs(in_tmp_dir, monkeypatch):
    (in_tmp_dir / "my_rewards.py").write_text(readme_block("reward-example:python", "python"))
    (in_tmp_dir / "my_reward.yaml").write_text(readme_block("reward-example:yaml", "yaml"))
    monkeypatch.syspath_prepend(str(in_tmp_dir))
    sys.modules.pop("my_rewards", None)
    cli = main([
        "fit", "--config", str(ROOT / "configs/sort_grpo.yaml"), "--config", "my_reward.yaml",
        "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=0", "--trainer.logger=false",
        "--trainer.enable_progress_bar=false", "--trainer.enable_checkpointing=false",
    ])
    metrics = cli.trainer.callback_metrics
    assert "train/rewards/starts_with_smallest" in metrics
    weights = {cb.name: cb.weight for cb in cli.model.reward_callbacks}
    assert weights == {"sort_inclusion_ordering": 1.0, "starts_with_smallest": 0.5}

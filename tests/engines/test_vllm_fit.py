"""`rlvr fit` with the vLLM backend on a tiny random Llama: trains, logs the engine/trainer mismatch,
resumes from a checkpoint; and under DDP on 2 CPU processes, one engine per rank."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import torch
import yaml

from .conftest import engine_config

REPO = Path(__file__).resolve().parents[2]
ENGINE = {"class_path": "rlvr_lightning.generation.VLLMGeneration", "init_args": {"kv_cache_memory_gib": 0.0625}}
EXAMPLES = [
    {"prompt": p, "answer": "a"} for p in ["What is 2+3?", "Say ab.", "Count to 3.", "The quick brown", "Numbers 0 1"]
]


def _config(tmp_path: Path, tokenizer_dir: Path, name: str, steps: int, **trainer) -> Path:
    config = {
        "seed_everything": 0,
        "trainer": {
            "max_epochs": 1,
            "limit_train_batches": steps,
            "limit_val_batches": 0,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "default_root_dir": str(tmp_path),
            "logger": {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": str(tmp_path), "name": name},
            },
            "callbacks": [
                {"class_path": "rlvr_lightning.rewards.ContainsReward", "init_args": {"target": "a"}},
                {"class_path": "rlvr_lightning.advantages.GroupNormalizedAdvantage"},
                {
                    "class_path": "rlvr_lightning.callbacks.RolloutCheckpoint",
                    "init_args": {
                        "dirpath": str(tmp_path / f"ckpt_{name}"),
                        "every_n_rollout_steps": 1,
                        "save_top_k": -1,
                    },
                },
            ],
            **trainer,
        },
        "model": {
            "class_path": "rlvr_lightning.modules.RLVRModule",
            "init_args": {
                "policy": {
                    "class_path": "rlvr_lightning.policies.HFPolicy",
                    "init_args": {
                        "model": {"config": engine_config(), "tokenizer": str(tokenizer_dir)},
                        "prompt": {"template": "raw"},
                        "generation": {"backend": ENGINE},
                    },
                },
                "optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": 1.0e-3}},
                "group_size": 4,
                "update": {"epochs": 2},
                "rollout_is": {"mode": "token_truncate"},
                "sampling": {"temperature": 1.0, "max_new_tokens": 6},
            },
        },
        "data": {
            "class_path": "rlvr_lightning.data.RLVRDataModule",
            "init_args": {
                "batch_size": 2,
                "task": {
                    "class_path": "rlvr_lightning.data.InlineTask",
                    "init_args": {"examples": EXAMPLES},
                },
            },
        },
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _train_rows(tmp_path: Path, name: str) -> list[dict[str, str]]:
    (metrics,) = sorted(tmp_path.glob(f"{name}/*/metrics.csv"))[-1:]
    with open(metrics) as handle:
        return [row for row in csv.DictReader(handle) if row.get("train/reward_mean")]


def test_fit_with_the_engine_logs_the_mismatch_and_resumes(tokenizer_dir, tmp_path, monkeypatch):
    from rlvr_lightning.cli.app import main

    monkeypatch.chdir(tmp_path)
    full = main(["fit", "--config", str(_config(tmp_path, tokenizer_dir, "full", steps=3))])
    assert full.trainer.global_step == 3 * 2  # rollout steps x epochs
    rows = _train_rows(tmp_path, "full")
    assert len(rows) == 3
    for row in rows:
        assert float(row["train/mismatch/abs_diff_max"]) <= 1e-4  # fp32 engine vs trainer
        assert float(row["train/mismatch/is_weight_mean"]) > 0
        assert float(row["train/generation/tokens_per_second"]) > 0
    assert full.model.policy.generation.weight_pushes == 3  # the first rollout, then after each step's updates

    # a new run (new engine) from the checkpoint after step 2
    (after_two,) = (tmp_path / "ckpt_full").glob("*rollout_step=2*.ckpt")
    resumed = main(
        ["fit", "--config", str(_config(tmp_path, tokenizer_dir, "resumed", steps=3)), "--ckpt_path", str(after_two)]
    )
    assert resumed.trainer.global_step == 3 * 2
    # on a CPU, with the fp32 engine, the resumed step 3 is the uninterrupted one: same seeds, same weights
    assert _train_rows(tmp_path, "resumed")[-1]["train/reward_mean"] == rows[-1]["train/reward_mean"]
    final, expected = resumed.model.policy.model.state_dict(), full.model.policy.model.state_dict()
    assert all(torch.equal(final[name], expected[name]) for name in expected)


def test_ddp_two_processes_each_with_its_own_engine(tokenizer_dir, tmp_path):
    config = _config(
        tmp_path,
        tokenizer_dir,
        "ddp",
        steps=2,
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        enable_checkpointing=False,
    )
    config_values = yaml.safe_load(config.read_text())
    config_values["trainer"]["callbacks"] = config_values["trainer"]["callbacks"][:2]
    config.write_text(yaml.safe_dump(config_values, sort_keys=False))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    result = subprocess.run(
        [sys.executable, "-m", "rlvr_lightning.cli", "fit", "--config", str(config)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = _train_rows(tmp_path, "ddp")
    assert len(rows) == 2
    assert all(float(row["train/mismatch/abs_diff_max"]) <= 1e-4 for row in rows)

"""SDPO through `rlvr fit`: a tiny random Llama taught by its own moving average re-prompted with its group's
successes, checkpointed every 2 rollout steps; resumed from step 2 of 4 it ends bitwise where the uninterrupted run
ends, its teacher copy included (tests/test_resume.py's pattern, in one process)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import yaml

from rlvr_lightning.cli.app import main
from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config

from .test_resume import logged, parameters

pytestmark = pytest.mark.usefixtures("one_thread")
STEPS = 4
EXAMPLES = [
    {"prompt": "What is 2+3?"},
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say ab."}]},
]


def config(tmp_path: Path, name: str, tokenizer: Path) -> Path:
    values = {
        "seed_everything": 5,
        "trainer": {
            "max_epochs": 1,
            "limit_train_batches": STEPS,
            "limit_val_batches": 0,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "logger": [
                {
                    "class_path": "lightning.pytorch.loggers.CSVLogger",
                    "init_args": {"save_dir": f"{tmp_path}/logs", "name": name},
                }
            ],
            "callbacks": [
                {"class_path": "rlvr_lightning.rewards.ContainsReward", "init_args": {"target": "a"}},
                {"class_path": "rlvr_lightning.advantages.GroupNormalizedAdvantage"},
                {
                    "class_path": "rlvr_lightning.callbacks.RolloutCheckpoint",
                    "init_args": {
                        "dirpath": f"{tmp_path}/ckpt_{name}",
                        "every_n_rollout_steps": 2,
                        "save_last": True,
                        "save_top_k": -1,
                    },
                },
            ],
        },
        "model": {
            "class_path": "rlvr_lightning.modules.RLVRModule",
            "init_args": {
                "policy": {
                    "class_path": "rlvr_lightning.policies.HFPolicy",
                    "init_args": {
                        "model": {"config": tiny_llama_config(), "tokenizer": str(tokenizer)},
                        "prompt": {"template": "chat"},
                    },
                },
                "teacher": {"class_path": "rlvr_lightning.modules.SelfTeacher", "init_args": {"ema_rate": 0.5}},
                "distillation": {"coef": 1.0, "rl_coef": 0.5},
                "optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": 1.0e-2}},
                "group_size": 4,
                "sampling": {"temperature": 1.0, "max_new_tokens": 6},
                "aggregation": {"mode": "seq-mean-token-mean"},
            },
        },
        "data": {
            "class_path": "rlvr_lightning.data.RLVRDataModule",
            "init_args": {
                "batch_size": 2,
                "task": {"class_path": "rlvr_lightning.data.InlineTask", "init_args": {"examples": EXAMPLES}},
            },
        },
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


def test_a_resumed_sdpo_run_is_bitwise_identical_teacher_copy_included(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tokenizer = save_tiny_tokenizer(tmp_path / "tokenizer")

    full = main(["fit", "--config", str(config(tmp_path, "full", tokenizer))])
    assert full.trainer.fit_loop.epoch_loop._batches_that_stepped == STEPS
    checkpoint = torch.load(tmp_path / "ckpt_full" / "epoch=0-rollout_step=2.ckpt", weights_only=False)
    copy_keys = [key for key in checkpoint["state_dict"] if key.startswith("teacher.copy.")]
    assert copy_keys and "teacher" not in checkpoint["hyper_parameters"]
    taught = logged(tmp_path, "full", "train/taught_rows")
    assert any(0 < float(value) for value in taught.values())  # some groups had a success to learn from
    assert any(0 < float(value) for value in logged(tmp_path, "full", "train/teacher_kl").values())

    (tmp_path / "ckpt_resumed").mkdir()
    shutil.copy(tmp_path / "ckpt_full" / "epoch=0-rollout_step=2.ckpt", tmp_path / "ckpt_resumed" / "last.ckpt")
    resumed = main(["fit", "--config", str(config(tmp_path, "resumed", tokenizer)), "--ckpt_path", "last"])
    assert resumed.trainer.fit_loop.epoch_loop._batches_that_stepped == STEPS
    expected, actual = parameters(full.model), parameters(resumed.model)
    assert expected.keys() == actual.keys()
    for key in expected:
        assert torch.equal(expected[key], actual[key]), key
    for key in ("train/teacher_kl", "train/taught_rows", "train/reward_mean"):
        full_log, resumed_log = logged(tmp_path, "full", key), logged(tmp_path, "resumed", key)
        assert sorted(resumed_log) == list(range(2, STEPS))
        assert resumed_log == {step: full_log[step] for step in resumed_log}

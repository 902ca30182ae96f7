"""The GSM8K GPU recipe made tiny for tests: a random Llama and six GSM8K-format lines (nothing downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

import lightning.pytorch as pl
import yaml

from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config
from rlvr_lightning.rewards.base import RewardCallback

PROBLEMS = [(2, 3), (4, 5), (1, 1), (7, 2), (3, 3), (6, 1)]


def write_tiny_gsm8k_override(tmp: Path, accelerator: str, problems: int = len(PROBLEMS)) -> Path:
    """A config file that swaps the recipe's model for a tiny random Llama (a 1024-token context: the R1-Zero
    prompt is ~330 of its tokens) and its data for `problems` GSM8K-format lines; one step of 2 x 4 responses."""
    data = tmp / "gsm8k.jsonl"
    data.write_text(
        "".join(
            json.dumps({"question": f"What is {a} + {b}?", "answer": f"{a}+{b}={a + b}\n#### {a + b}"}) + "\n"
            for a, b in PROBLEMS[:problems]
        )
    )
    override = {
        "trainer": {
            "accelerator": accelerator,
            "devices": 1,
            "limit_train_batches": 1,
            "limit_val_batches": 1,
            "val_check_interval": 1,
            "logger": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "default_root_dir": str(tmp / "runs"),
        },
        "model": {
            "init_args": {
                "policy": {
                    "init_args": {
                        "model": {
                            "name_or_path": None,
                            "config": tiny_llama_config(max_position_embeddings=1024),
                            "tokenizer": str(save_tiny_tokenizer(tmp / "tokenizer")),
                        }
                    }
                },
                "group_size": 4,
                "sampling": {"max_new_tokens": 8},
                "update": {"mini_batch_size": 4, "micro_batch_size": 2},
                "validation": {"group_size": 2, "greedy": False},
            }
        },
        "data": {
            "init_args": {
                "batch_size": 2,
                "val_batch_size": 2,
                "task": {
                    "class_path": "rlvr_lightning.data.JSONLTask",
                    "init_args": {"path": str(data), "val_path": str(data), "num_val": 2},
                },
            }
        },
    }
    path = tmp / "tiny.yaml"
    path.write_text(yaml.safe_dump(override))
    return path


class WeightsAtStart(pl.Callback):
    """The policy's weights when training starts, and their devices (Lightning moves the module to the CPU
    when `fit` ends)."""

    def on_train_start(self, trainer, pl_module):
        self.weights = [p.detach().clone() for p in pl_module.policy.parameters()]
        self.devices = {p.device.type for p in self.weights}


class EvenTokenReward(RewardCallback):
    """Varies over a random model's responses (GSM8K's rewards are all 0 there: no advantage, no gradient)."""

    def score(self, rollout):
        mask = rollout.response_mask
        return ((rollout.response_ids % 2 == 0).float() * mask).sum(-1) / mask.sum(-1).clamp(min=1)

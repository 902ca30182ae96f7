"""Helpers for the multi-process FSDP2 tests (tests/test_fsdp.py): configs of small runs of every module
on a tiny random Llama and a reward with a known pass rate (the callbacks that record what a rank ends with
are in tests/fsdp_recorders.py).

Run as a script, it is one rank of an externally launched job (torchrun-style environment: RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), which runs several `rlvr fit`s in a row, so that the
job starts its processes once:

    python tests/fsdp_support.py OUT TOKENIZER_DIR RUN [RUN ...]     (RUN: <case>:<strategy>)
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import torch
import yaml

from rlvr_lightning.rewards.base import RewardCallback

TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}
PROMPTS = [
    "What is 2+3?",
    "The quick brown",
    "def add(a, b):",
    "Count one two",
    "A verifiable reward",
    "Think step by step",
]
STRATEGIES = {
    "ddp": "ddp",
    "fsdp2": "fsdp2",
    "fsdp2_full_ckpt": {
        "class_path": "rlvr_lightning.parallel.FSDP2Strategy",
        "init_args": {"save_distributed_checkpoint": False},
    },
}


class EvenTokenReward(RewardCallback):
    """The fraction of response tokens with an even id: varied and known without a trained model."""

    def score(self, rollout):
        mask = rollout.response_mask
        even = (rollout.response_ids % 2 == 0).float() * mask
        return even.sum(-1) / mask.sum(-1).clamp(min=1)


@contextmanager
def evaluation_as_on_gpus():
    """Lightning evaluates (`validate`, `test`, `predict`) under `torch.inference_mode`, except over gloo where it
    takes `no_grad`; inside this, gloo runs take the inference-mode path that NCCL runs take."""
    with mock.patch("lightning.pytorch.loops.utilities._distributed_is_initialized", return_value=False):
        yield


def policy(tokenizer_dir: str, **options) -> dict:
    return {
        "class_path": "rlvr_lightning.policies.HFPolicy",
        "init_args": {**options, "model": {"config": TINY_LLAMA, "tokenizer": tokenizer_dir}},
    }


def inline_data(batch_size: int = 2) -> dict:
    return {
        "class_path": "rlvr_lightning.data.RLVRDataModule",
        "init_args": {
            "batch_size": batch_size,
            "val_batch_size": 2,
            "task": {
                "class_path": "rlvr_lightning.data.InlineTask",
                "init_args": {
                    "examples": [{"prompt": p} for p in PROMPTS],
                    "val_examples": [{"prompt": p} for p in PROMPTS[:4]],
                },
            },
        },
    }


def trainer(strategy: str, steps: int, callbacks: list, **options) -> dict:
    return {
        "strategy": STRATEGIES[strategy],
        "accelerator": "cpu",
        "devices": 2,
        "max_epochs": 1,
        "limit_train_batches": steps,
        "limit_val_batches": 0,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        "logger": False,
        "callbacks": [{"class_path": "fsdp_support.EvenTokenReward"}, *callbacks],
        **options,
    }


def case_config(case: str, strategy: str, out: str, tokenizer_dir: str) -> dict:
    """The run `case` under `strategy` (same global batch under every strategy: each rank its own prompts)."""
    record = [{"class_path": "fsdp_recorders.FinalWeights", "init_args": {"out": out, "name": f"{case}-{strategy}"}}]
    if strategy == "ddp":
        record.append(
            {"class_path": "fsdp_recorders.GradientSyncs", "init_args": {"out": out, "name": f"{case}-{strategy}"}}
        )
    # plain SGD where it can be: Adam would hide a wrong gradient scale (its update is scale-free)
    sgd = {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.5}}
    adam = {"class_path": "torch.optim.Adam", "init_args": {"lr": 0.001}}
    if case in ("rl", "rl_lora"):  # 2 rollout steps x 2 epochs = 4 updates; KL to a (sharded) reference
        lora = {"lora": {"r": 4, "alpha": 8.0}} if case == "rl_lora" else {}
        refresh = {} if lora else {"refresh_every": 1, "mixup_alpha": 0.5}
        model = {
            "class_path": "rlvr_lightning.modules.RLVRModule",
            "init_args": {
                "policy": policy(tokenizer_dir, **lora),
                "optimizer": sgd,
                "group_size": 4,
                "sampling": {"max_new_tokens": 6},
                "kl": {"coef": 0.1, **refresh},
                "update": {"epochs": 2, "mini_batch_size": 8, "micro_batch_size": 4, "max_grad_norm": 1.0e3},
            },
        }
        check = {
            "class_path": "fsdp_recorders.ShardedSampling",
            "init_args": {"out": out, "name": f"{case}-{strategy}", "tokenizer_dir": tokenizer_dir},
        }
        callbacks = record + ([check] if case == "rl" else [])
        data = inline_data()
        if case == "rl":  # a curriculum refresh first: 5 candidates, 3 and 2 per rank, sampled in 2 and 1 calls
            data["init_args"]["difficulty_filter"] = {
                "class_path": "rlvr_lightning.data.DifficultyFilter",
                "init_args": {"n": 2, "max_candidates": 5, "batch_size": 2, "pass_threshold": 0.5},
            }
        return {"seed_everything": 0, "trainer": trainer(strategy, 2, callbacks), "model": model, "data": data}
    if case == "sft":  # 3 optimizer steps of 2 pairs per rank, clipped by the Trainer
        pairs = Path(out, "pairs.jsonl")
        pairs.write_text("".join(json.dumps({"prompt": p, "response": p[::-1]}) + "\n" for p in PROMPTS * 2))
        model = {
            "class_path": "rlvr_lightning.modules.SFTModule",
            "init_args": {"policy": policy(tokenizer_dir), "optimizer": adam},
        }
        data = {
            "class_path": "rlvr_lightning.data.SFTDataModule",
            "init_args": {"train_file": str(pairs), "batch_size": 2},
        }
        run = trainer(strategy, 3, record, gradient_clip_val=1.0)
        return {"seed_everything": 0, "trainer": run, "model": model, "data": data}
    if case == "ei":  # 2 rounds; the ranks keep different numbers of responses
        model = {
            "class_path": "rlvr_lightning.modules.ExpertIterationModule",
            "init_args": {
                "policy": policy(tokenizer_dir),
                "optimizer": sgd,
                "group_size": 4,
                "sampling": {"max_new_tokens": 6},
                "reward_threshold": 0.5,
                "update": {"epochs": 2, "mini_batch_size": 2, "micro_batch_size": 1},
            },
        }
        return {"seed_everything": 0, "trainer": trainer(strategy, 2, record), "model": model, "data": inline_data()}
    if case in ("ppo", "ppo_whole"):  # a separate critic (its untied LM head gets no gradient), warmed up for a step
        model = {
            "class_path": "rlvr_lightning.modules.PPOModule",
            "init_args": {
                "policy": policy(tokenizer_dir),
                "optimizer": sgd,
                "value": {"lr": 0.1, "warmup_steps": 1},
                "group_size": 4,
                "sampling": {"max_new_tokens": 6},
                "update": {
                    "mini_batch_size": 4,
                    "micro_batch_size": None if case == "ppo_whole" else 2,
                    "max_grad_norm": 1.0e3,
                },
            },
        }
        return {"seed_everything": 0, "trainer": trainer(strategy, 2, record), "model": model, "data": inline_data()}
    if case == "validate_first":  # validated, then one step (validated before it and after it)
        model = {
            "class_path": "rlvr_lightning.modules.RLVRModule",
            "init_args": {
                "policy": policy(tokenizer_dir),
                "optimizer": sgd,
                "group_size": 4,
                "sampling": {"max_new_tokens": 6},
                "kl": {"coef": 0.1},
            },
        }
        return {
            "seed_everything": 0,
            "trainer": trainer(strategy, 1, record, limit_val_batches=1),
            "model": model,
            "data": inline_data(),
        }
    if case in ("rl_packed", "ppo_packed"):  # rl and ppo with micro-batches of at most 64 tokens, scored packed
        config = case_config(case.removesuffix("_packed"), strategy, out, tokenizer_dir)
        update = config["model"]["init_args"]["update"]
        update.update(micro_batch_size=None, micro_batch_tokens=64)
        # packed forwards under DDP too (prefix sharing would score these groups of 4 with fewer positions)
        config["model"]["init_args"]["policy"]["init_args"]["generation"] = {"share_prompt_prefix": False}
        for callback in config["trainer"]["callbacks"]:
            if "name" in callback.get("init_args", {}):
                callback["init_args"]["name"] = f"{case}-{strategy}"
        return config
    if (
        case == "lora_ckpt"
    ):  # one rollout step of rl_lora that ends with a checkpoint (a .ckpt file under fsdp2_full_ckpt)
        config = case_config("rl_lora", strategy, out, tokenizer_dir)
        config["trainer"].update(limit_train_batches=1, enable_checkpointing=True)
        config["trainer"]["callbacks"][1]["init_args"]["name"] = f"{case}-{strategy}"
        config["trainer"]["callbacks"].append(
            {
                "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                "init_args": {"dirpath": f"{out}/ckpt_{case}-{strategy}", "filename": "final"},
            }
        )
        return config
    raise ValueError(f"unknown case {case!r}")


def resume_config(name: str, out: str, tokenizer_dir: str, steps: int, wait_at: int | None = None) -> dict:
    """An RL run under fsdp2 with what a checkpoint must carry: sharded weights of the policy and of a KL reference
    refreshed every 3 steps, Adam and an LR scheduler, shuffled mini-batches, dynamic sampling (top-up draws),
    sampled validation every 3 steps; sharded checkpoints every 2 rollout steps, CSV log."""
    callbacks = [
        {"class_path": "rlvr_lightning.advantages.GroupNormalizedAdvantage"},
        {
            "class_path": "rlvr_lightning.callbacks.RolloutCheckpoint",
            "init_args": {"dirpath": f"{out}/ckpt_{name}", "every_n_rollout_steps": 2, "save_last": True},
        },
        {"class_path": "fsdp_recorders.FinalWeights", "init_args": {"out": out, "name": name}},
    ]
    if wait_at is not None:
        callbacks.append(
            {
                "class_path": "fsdp_recorders.WaitAtStep",
                "init_args": {"step": wait_at, "marker": f"{out}/{name}.waiting"},
            }
        )
    model = {
        "class_path": "rlvr_lightning.modules.RLVRModule",
        "init_args": {
            "policy": policy(tokenizer_dir),
            "optimizer": {"class_path": "torch.optim.Adam", "init_args": {"lr": 0.01}},
            "lr_scheduler": {
                "class_path": "torch.optim.lr_scheduler.StepLR",
                "init_args": {"step_size": 3, "gamma": 0.5},
            },
            "group_size": 4,
            "sampling": {"max_new_tokens": 6},
            "kl": {"coef": 0.05, "refresh_every": 3},
            "update": {"epochs": 2, "mini_batch_size": 4},
            "dynamic_sampling": {"enabled": True},
            "validation": {"greedy": False, "group_size": 2},
        },
    }
    run = trainer(
        "fsdp2",
        steps,
        callbacks,
        limit_val_batches=1,
        val_check_interval=3,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        enable_checkpointing=True,
        logger=[
            {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": f"{out}/logs", "name": name},
            }
        ],
    )
    return {"seed_everything": 3, "trainer": run, "model": model, "data": inline_data()}


def write_config(config: dict, path: Path) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def main(out: str, tokenizer_dir: str, runs: list[str]) -> None:
    from rlvr_lightning.cli.app import main as rlvr

    torch.set_num_threads(1)
    rank = os.environ["RANK"]
    for run in runs:
        case, strategy = run.split(":")
        config = write_config(
            case_config(case, strategy, out, tokenizer_dir), Path(out, f"{case}-{strategy}.rank{rank}.yaml")
        )
        if case == "validate_first":  # one trainer and module: validated, then trained
            with evaluation_as_on_gpus():
                cli = rlvr(["--config", str(config)], run=False)
                cli.trainer.validate(cli.model, datamodule=cli.datamodule)
                cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        else:
            rlvr(["fit", "--config", str(config)])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])

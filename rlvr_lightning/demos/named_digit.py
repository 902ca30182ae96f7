"""A verifiable task a tiny random Llama learns in a few dozen steps, and `rlvr fit` runs that train it.

The task ("repeat the named digit"): a prompt is 0 to 3 filler words, `say` and a digit (`"c a say 7"`); the
reward is the share of the 4 response positions that hold that digit (`"7 7 7 7"` earns 1). The vocabulary has
20 words (a word-level tokenizer built here), so a random model earns about 1/20; every response position and
so every decoding step of the sampler counts, and the batches are left-padded.

    config = fit_config(tokenizer_dir, seed=0)                  # GRPO; module=/policy= override options
    cli, curve = fit(config, tmp_path)        # `rlvr fit` in-process; curve.rewards: the mean reward per step
    greedy_accuracy(cli.model.policy)         # held-out prompts answered in full, greedily (curve.accuracy_at_start)

`NamedDigitTask`'s validation set is those 50 held-out prompts (the configs of `fit_config` validate on none:
`limit_val_batches: 0`). The learning tests of the sampling loops and `scripts/sampling_precision_curves.py`
train on this task.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import yaml
from torch import Tensor

from rlvr_lightning.data.inline_task import InlineTask
from rlvr_lightning.demos.tiny_lm import tiny_llama_config
from rlvr_lightning.rewards.base import RewardCallback

PAD, EOS = "<|pad|>", "<|endoftext|>"
DIGITS = [str(d) for d in range(10)]
FILLER = ["a", "b", "c", "d", "e", "f", "g"]
WORDS = [PAD, EOS, *DIGITS, *FILLER, "say"]
RESPONSE_LENGTH = 4  # the task's max_new_tokens


def build_word_tokenizer(words: list[str] = WORDS) -> Any:
    """Whitespace-separated `words`, one id each (pad 0, EOS 1); no BOS."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token=PAD))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=PAD, eos_token=EOS)


def save_word_tokenizer(directory: str | Path, words: list[str] = WORDS) -> Path:
    directory = Path(directory)
    build_word_tokenizer(words).save_pretrained(str(directory))
    return directory


def examples(count: int, seed: int) -> list[dict[str, Any]]:
    """`InlineTask` examples: {"prompt": "c a say 7", "answer": "7"}."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        digit = rng.choice(DIGITS)
        filler = rng.choices(FILLER, k=rng.randint(0, 3))
        out.append({"prompt": " ".join([*filler, "say", digit]), "answer": digit})
    return out


TRAIN_EXAMPLES = examples(200, seed=0)
VAL_EXAMPLES = [e for e in examples(400, seed=1) if e not in TRAIN_EXAMPLES][:50]  # prompts not trained on


class NamedDigitTask(InlineTask):
    """The training examples as a task, streamed in a seeded order, and the held-out ones as its validation set
    (a config names it, not 250 examples: the CLI's parser copies every value of a config many times)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__(TRAIN_EXAMPLES, val_examples=VAL_EXAMPLES, seed=seed)


class NamedDigitReward(RewardCallback):
    """The share of the first `length` response positions that hold the digit the prompt names
    (`metadata["answer"]`); positions after the response ended count as misses."""

    def __init__(self, length: int = RESPONSE_LENGTH, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.length = length

    def score(self, rollout) -> Tensor:
        answers = torch.tensor([WORDS.index(m["answer"]) for m in rollout.metadata], device=rollout.response_ids.device)
        ids, mask = rollout.response_ids[:, : self.length], rollout.response_mask[:, : self.length]
        return ((ids == answers[:, None]) & (mask > 0)).float().sum(-1) / self.length

    def is_correct(self, rollout, scores: Tensor) -> Tensor:
        return scores == 1


class RewardCurve(pl.Callback):
    """The logged mean reward of every rollout step, and the held-out greedy accuracy before training."""

    def __init__(self) -> None:
        self.rewards: list[float] = []
        self.accuracy_at_start: float | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.accuracy_at_start = greedy_accuracy(pl_module.policy)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        reward = trainer.callback_metrics.get("train/reward_mean")
        if reward is not None:  # with rollout_staleness 1 the first step only samples
            self.rewards.append(float(reward))


def model_config(**overrides: Any) -> dict[str, Any]:
    """The tiny Llama (`HFPolicy(config=...)`). Initialised with std 0.1 rather than transformers' 0.02: the
    logits of a model this small then move within a few dozen steps at a learning rate that stays stable."""
    return tiny_llama_config(**{"max_position_embeddings": 32, "initializer_range": 0.1, **overrides})


def fit_config(
    tokenizer_dir: str | Path,
    seed: int,
    steps: int = 60,
    module_class: str = "RLVRModule",
    module: dict[str, Any] | None = None,
    policy: dict[str, Any] | None = None,
    lr: float = 2e-3,
    batch_size: int = 16,
) -> dict[str, Any]:
    """An `rlvr fit` config: GRPO (16 prompts a step, 16 responses each, one update per step) on the task."""
    policy_args = {"model": {"config": model_config(), "tokenizer": str(tokenizer_dir)}, "prompt": {"template": "raw"}}
    for group, options in (policy or {}).items():  # each option group merged, key by key
        policy_args[group] = {**policy_args.get(group, {}), **options}
    module_args = {
        "policy": {"class_path": "rlvr_lightning.policies.HFPolicy", "init_args": policy_args},
        "optimizer": {"class_path": "torch.optim.Adam", "init_args": {"lr": lr}},
        "group_size": 16,
        "sampling": {"temperature": 1.0, "max_new_tokens": RESPONSE_LENGTH},
    }
    module_args.update(module or {})
    return {
        "seed_everything": seed,
        "trainer": {
            "max_epochs": 1,
            "limit_train_batches": steps,
            "limit_val_batches": 0,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "callbacks": [
                {"class_path": f"{__name__}.NamedDigitReward", "init_args": {"on_error": "raise"}},
                {"class_path": f"{__name__}.RewardCurve"},
            ],
        },
        "model": {"class_path": f"rlvr_lightning.modules.{module_class}", "init_args": module_args},
        "data": {
            "class_path": "rlvr_lightning.data.RLVRDataModule",
            "init_args": {
                "batch_size": batch_size,
                "task": {"class_path": f"{__name__}.NamedDigitTask", "init_args": {"seed": seed}},
            },
        },
    }


def fit(config: dict[str, Any], directory: str | Path) -> tuple[Any, RewardCurve]:
    """`rlvr fit --config <config>` in this process, writing under `directory`; the CLI and the reward curve."""
    from rlvr_lightning.cli.app import main

    directory = Path(directory)
    config = {**config, "trainer": {**config["trainer"], "default_root_dir": str(directory)}}
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    cli = main(["fit", "--config", str(path)])
    return cli, next(cb for cb in cli.trainer.callbacks if isinstance(cb, RewardCurve))


@torch.no_grad()
def greedy_accuracy(policy, val_examples: list[dict[str, Any]] = VAL_EXAMPLES) -> float:
    """The share of held-out prompts whose greedy response is the named digit at every position."""
    from rlvr_lightning.generation.sampling_config import SamplingConfig

    batch = {"prompt": [e["prompt"] for e in val_examples], "metadata": [dict(e) for e in val_examples]}
    rollout = policy.sample(batch, 1, SamplingConfig(do_sample=False, max_new_tokens=RESPONSE_LENGTH))
    reward = NamedDigitReward()
    return float(reward.is_correct(rollout, reward.score(rollout)).float().mean())


def mean(values: list[float]) -> float:
    return sum(values) / len(values)

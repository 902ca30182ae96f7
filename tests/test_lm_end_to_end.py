"""GRPO on language models end to end through `rlvr fit`.

A tiny random Llama and a byte-level BPE tokenizer are built in the test (nothing downloaded),
saved to a temporary directory and named by path in a YAML config written on the spot; the CLI
runs in-process. The SmolLM2 test runs `configs/smollm2_demo.yaml` for one short step and is
skipped unless the model has been fetched (`rlvr-models fetch smollm2-135m-instruct`).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
import yaml

from rlvr_lightning.cli.app import main
from rlvr_lightning.demos.tiny_lm import build_tiny_tokenizer, tiny_llama_config

ROOT = Path(__file__).resolve().parents[1]

GENERATION_KEYS = {
    "train/generation/response_length/mean",
    "train/generation/response_length/min",
    "train/generation/response_length/max",
    "train/generation/truncated_fraction",
    "train/generation/tokens_per_second",
}
TIME_KEYS = {"time/generation_s", "time/scoring_s", "time/update_s", "time/step_s"}


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A saved random Llama + tokenizer: what a user's local checkpoint looks like."""
    from transformers import AutoConfig, AutoModelForCausalLM

    directory = tmp_path_factory.mktemp("tiny_llama")
    tokenizer = build_tiny_tokenizer()
    values = tiny_llama_config()
    model_type = values.pop("model_type")
    config = AutoConfig.for_model(
        model_type,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        **values,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory


CHAT_EXAMPLES = [
    {"prompt": "What is 2+3?", "answer": "5"},
    {"prompt": "Say ab.", "answer": "ab"},
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count: 1 2"}], "answer": "3"},
]


def _config(
    tmp_path: Path,
    policy: dict,
    module: dict | None = None,
    trainer: dict | None = None,
    task: dict | None = None,
) -> Path:
    config = {
        "seed_everything": 0,
        "trainer": {
            "max_epochs": 1,
            "limit_train_batches": 3,
            "limit_val_batches": 1,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "default_root_dir": str(tmp_path),
            "logger": {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": str(tmp_path), "name": "csv"},
            },
            "callbacks": [
                {"class_path": "rlvr_lightning.rewards.ContainsReward", "init_args": {"target": "a"}},
                {"class_path": "rlvr_lightning.advantages.GroupNormalizedAdvantage"},
            ],
            **(trainer or {}),
        },
        "model": {
            "class_path": "rlvr_lightning.modules.RLVRModule",
            "init_args": {
                "policy": {"class_path": "rlvr_lightning.policies.HFPolicy", "init_args": policy},
                "optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": 1.0e-3}},
                "group_size": 4,
                "sampling": {"temperature": 1.0, "max_new_tokens": 6},
                **(module or {}),
            },
        },
        "data": {
            "class_path": "rlvr_lightning.data.RLVRDataModule",
            "init_args": {
                "batch_size": 2,
                "task": {
                    "class_path": "rlvr_lightning.data.InlineTask",
                    "init_args": task or {"examples": CHAT_EXAMPLES, "val_examples": CHAT_EXAMPLES[:2]},
                },
            },
        },
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _logged_rows(tmp_path: Path) -> list[dict[str, str]]:
    files = sorted(tmp_path.glob("csv/*/metrics.csv"))
    assert files, f"no metrics.csv under {tmp_path}/csv"
    with open(files[-1]) as handle:
        return list(csv.DictReader(handle))


def _train_rows(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return [row for row in rows if row.get("train/reward_mean")]


def test_grpo_steps_on_a_saved_tiny_llama(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = _config(tmp_path, {"model": {"name_or_path": str(tiny_model_dir)}, "prompt": {"template": "chat"}})
    initial = {k: v.clone() for k, v in _state(tiny_model_dir).items()}

    cli = main(["fit", "--config", str(config)])

    trainer = cli.trainer
    assert trainer.fit_loop.epoch_loop._batches_that_stepped == 3
    assert trainer.global_step == 3  # one optimizer step per rollout step
    rows = _logged_rows(tmp_path)
    train = _train_rows(rows)
    assert len(train) == 3
    logged = {key for row in train for key, value in row.items() if value != ""}
    assert GENERATION_KEYS | TIME_KEYS | {"train/loss", "train/grad_norm", "train/entropy"} <= logged
    for row in train:
        assert (
            1
            <= float(row["train/generation/response_length/min"])
            <= float(row["train/generation/response_length/mean"])
        )
        assert float(row["train/generation/response_length/max"]) <= 6
        assert 0.0 <= float(row["train/generation/truncated_fraction"]) <= 1.0
        assert float(row["train/generation/tokens_per_second"]) > 0
        assert float(row["time/generation_s"]) > 0 and float(row["time/update_s"]) > 0
        assert torch.isfinite(torch.tensor(float(row["train/loss"])))
    assert any(row.get("val/reward_mean") for row in rows)  # validation ran (greedy decoding)

    # the policy moved: the weights differ from the saved checkpoint
    trained = cli.model.policy.model.state_dict()
    moved = [name for name, value in initial.items() if not torch.equal(value, trained[name])]
    assert moved


def _state(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(directory / "model.safetensors"))


def test_grpo_from_a_config_with_reference_minibatches_and_sampling_log_probs(tokenizer_dir_e2e, tmp_path, monkeypatch):
    """Random weights from `config:`, a KL reference, two inner epochs over two mini-batches
    (old log-probs reused from sampling), micro-batching and a stop string."""
    monkeypatch.chdir(tmp_path)
    policy = {
        "model": {"config": tiny_llama_config(), "tokenizer": str(tokenizer_dir_e2e)},
        "prompt": {"template": "{prompt}\nAnswer:"},
        "generation": {"keep_sampling_log_probs": True},
    }
    module = {
        "update": {"epochs": 2, "mini_batch_size": 4, "micro_batch_size": 2},
        "kl": {"coef": 0.05},
        "sampling": {"temperature": 0.9, "top_k": 50, "max_new_tokens": 5, "stop_strings": ["."]},
    }
    task = {"examples": [{"prompt": "What is 2+3?"}, {"prompt": "Say ab."}]}  # a template string takes text prompts
    config = _config(tmp_path, policy, module, trainer={"limit_train_batches": 2, "limit_val_batches": 0}, task=task)

    cli = main(["fit", "--config", str(config)])

    assert cli.trainer.global_step == 2 * 2 * 2  # rollout steps x epochs x mini-batches
    train = _train_rows(_logged_rows(tmp_path))
    assert len(train) == 2
    assert all(row.get("train/kl") for row in train)
    assert all(float(row["train/generation/response_length/max"]) <= 5 for row in train)


def _fit_with_advantage(tokenizer_dir: Path, tmp_path: Path, advantage: str, module: dict | None = None):
    """Two steps of a random tiny Llama on two text prompts, with `advantage` (a class of rlvr_lightning.advantages)."""
    policy = {
        "model": {"config": tiny_llama_config(), "tokenizer": str(tokenizer_dir)},
        "prompt": {"template": "{prompt}"},
    }
    trainer = {
        "limit_train_batches": 2,
        "limit_val_batches": 0,
        "callbacks": [
            {"class_path": "rlvr_lightning.rewards.ContainsReward", "init_args": {"target": "a"}},
            {"class_path": f"rlvr_lightning.advantages.{advantage}"},
        ],
    }
    task = {"examples": [{"prompt": "What is 2+3?"}, {"prompt": "Say ab."}]}
    return main(["fit", "--config", str(_config(tmp_path, policy, module, trainer=trainer, task=task))])


def test_optimal_token_baseline_with_packed_micro_batches(tokenizer_dir_e2e, tmp_path, monkeypatch):
    """OTB's token energies from a Hugging Face policy whose updates run packed micro-batches."""
    monkeypatch.chdir(tmp_path)
    module = {"update": {"mini_batch_size": 4, "micro_batch_tokens": 64}}
    cli = _fit_with_advantage(tokenizer_dir_e2e, tmp_path, "OptimalTokenBaseline", module)

    rollout = cli.model.last_rollout
    mask = rollout.response_mask.bool()
    assert rollout.token_energy.shape == rollout.response_ids.shape and (rollout.token_energy[~mask] == 0).all()
    assert (rollout.token_energy[mask] > 0).all() and rollout.advantages.shape == rollout.response_ids.shape
    assert cli.trainer.global_step == 2 * 2 and len(_train_rows(_logged_rows(tmp_path))) == 2


def test_remax_decodes_a_greedy_response_per_prompt_and_keeps_the_sampled_statistics(
    tokenizer_dir_e2e, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    cli = _fit_with_advantage(tokenizer_dir_e2e, tmp_path, "GreedyBaselineAdvantage")

    rollout = cli.model.last_rollout
    assert rollout.greedy_reward.shape == (8,) and torch.equal(
        rollout.greedy_reward[::4].repeat_interleave(4), rollout.greedy_reward
    )
    train = _train_rows(_logged_rows(tmp_path))
    assert len(train) == 2
    for row in train:
        assert float(row["train/generation/num_rows"]) == 8  # the sampled rollout's, not the greedy responses'
        assert 0 <= float(row["train/greedy_reward_mean"]) <= 1


@pytest.fixture(scope="module")
def tokenizer_dir_e2e(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tiny_tokenizer")
    build_tiny_tokenizer().save_pretrained(str(directory))
    return directory


def test_missing_model_path_fails_before_training(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "no_such_model"
    config = _config(tmp_path, {"model": {"name_or_path": str(missing)}})
    # jsonargparse reports the policy's FileNotFoundError inside its own ValueError
    with pytest.raises((FileNotFoundError, ValueError), match=r"Model path '[^']*no_such_model' does not exist"):
        main(["fit", "--config", str(config)])


def test_prompt_longer_than_the_context_names_the_prompt(tokenizer_dir_e2e, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    policy = {
        "model": {"config": tiny_llama_config(max_position_embeddings=24), "tokenizer": str(tokenizer_dir_e2e)},
        "prompt": {"template": "raw"},
    }
    task = {
        "examples": [{"prompt": "short"}, {"prompt": "The quick brown fox jumps over the lazy dog. " * 4}],
        "shuffle": False,
    }
    config = _config(tmp_path, policy, trainer={"limit_val_batches": 0}, task=task)
    with pytest.raises(ValueError, match=r"prompt 1 of the batch is \d+ tokens long.*context of 24 tokens"):
        main(["fit", "--config", str(config)])


SMOLLM2 = "smollm2-135m-instruct"


def _smollm2_fetched() -> bool:
    from rlvr_lightning.runtime.model_cache import is_fetched

    return is_fetched(SMOLLM2)


@pytest.mark.skipif(not _smollm2_fetched(), reason=f"{SMOLLM2} not fetched (rlvr-models fetch {SMOLLM2})")
def test_smollm2_demo_config_samples_and_trains(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = main(
        [
            "fit",
            "--config",
            str(ROOT / "configs" / "smollm2_demo.yaml"),
            "--trainer.limit_train_batches=1",
            "--trainer.limit_val_batches=0",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
            f"--trainer.logger.save_dir={tmp_path}",
            "--trainer.logger.name=csv",
            "--model.init_args.group_size=2",
            "--model.init_args.sampling.max_new_tokens=8",
            "--data.init_args.batch_size=1",
        ]
    )
    assert cli.trainer.global_step == 1
    train = _train_rows(_logged_rows(tmp_path))
    assert len(train) == 1
    assert 1 <= float(train[0]["train/generation/response_length/max"]) <= 8
    assert torch.isfinite(torch.tensor(float(train[0]["train/loss"])))

"""Training on multi-turn rollouts: `rlvr fit` with a calculator named in YAML logs the tool metrics, and
micro-batching stays exact gradient accumulation when responses have observation holes."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
import yaml

sys.path.insert(0, str(Path(__file__).parent / "policies"))

from scripted_lm import save_tool_tokenizer, script_weights, transitions

from rlvr_lightning.demos.tiny_lm import tiny_llama_config
from rlvr_lightning.modules.options import AggregationConfig, UpdateConfig
from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions, PromptOptions
from rlvr_lightning.rollout import TokenSource

EXAMPLES = [{"prompt": "What is 2+3?", "answer": "5"}, {"prompt": "Say ab. What is 2+3?", "answer": "5"}]
TOOLS = {
    "class_path": "rlvr_lightning.multiturn.ToolUse",
    "init_args": {
        "tools": [{"class_path": "rlvr_lightning.tools.Calculator"}],
        "max_turns": 3,
        "max_observation_tokens": 8,
    },
}


def scripted_policy(tokenizer_dir, **kwargs):
    """A tiny Llama that tends to call `<calculator>2+3</calculator>` and then answer (see scripted_lm.py)."""
    from rlvr_lightning.policies.hf import HFPolicy

    torch.manual_seed(0)
    policy = HFPolicy(
        model=HFModelOptions(config=tiny_llama_config(), tokenizer=str(tokenizer_dir)),
        prompt=PromptOptions(template="raw"),
        **kwargs,
    )
    tok = policy.tokenizer
    last = tok("?", add_special_tokens=False)["input_ids"][-1]
    script_weights(
        policy,
        transitions(tok, [[last, "<calculator>2+3</calculator>"], ["</result>", "The answer is 5.", tok.eos_token_id]]),
    )
    return policy


def test_rlvr_fit_with_a_calculator_from_yaml(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model_dir = tmp_path / "model"
    scripted_policy(save_tool_tokenizer(tmp_path / "tok")).save_pretrained(model_dir)
    config = {
        "seed_everything": 0,
        "trainer": {
            "max_epochs": 1,
            "limit_train_batches": 2,
            "limit_val_batches": 1,
            "val_check_interval": 2,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "logger": {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": str(tmp_path), "name": "csv"},
            },
            "callbacks": [
                {"class_path": "rlvr_lightning.rewards.ContainsReward", "init_args": {"target": "5"}},
                {"class_path": "rlvr_lightning.advantages.CenteredAdvantage"},
            ],
        },
        "model": {
            "class_path": "rlvr_lightning.modules.RLVRModule",
            "init_args": {
                "policy": {
                    "class_path": "rlvr_lightning.policies.HFPolicy",
                    "init_args": {
                        "model": {"name_or_path": str(model_dir)},
                        "prompt": {"template": "raw"},
                        "generation": {"tools": TOOLS},
                    },
                },
                "optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": 1.0e-3}},
                "group_size": 4,
                "sampling": {"temperature": 0.7, "max_new_tokens": 24},
            },
        },
        "data": {
            "class_path": "rlvr_lightning.data.RLVRDataModule",
            "init_args": {
                "batch_size": 2,
                "task": {
                    "class_path": "rlvr_lightning.data.InlineTask",
                    "init_args": {"examples": EXAMPLES, "val_examples": EXAMPLES},
                },
            },
        },
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    from rlvr_lightning.cli.app import main

    cli = main(["fit", "--config", str(path)])
    assert cli.model.policy.segment_rules[0].max_turns == 3
    with open(next(tmp_path.glob("csv/*/metrics.csv"))) as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("train/reward_mean")]
    assert len(rows) == 2
    for key in ("tool_calls/mean", "tool_errors", "tool_seconds", "turns/mean", "turns/max", "rounds"):
        assert all(row[f"train/generation/{key}"] != "" for row in rows), key
    assert max(float(row["train/generation/tool_calls/mean"]) for row in rows) > 0
    assert max(float(row["train/generation/turns/max"]) for row in rows) >= 2
    assert cli.trainer.callback_metrics["val/response_length"] > 0  # validation samples with the tools too


def final_parameters(tokenizer_dir, micro_batch_size):
    from rlvr_lightning.advantages import CenteredAdvantage
    from rlvr_lightning.data import RLVRDataModule
    from rlvr_lightning.data.inline_task import InlineTask
    from rlvr_lightning.generation.sampling_config import SamplingConfig
    from rlvr_lightning.modules import RLVRModule
    from rlvr_lightning.multiturn.tool_use import ToolUse
    from rlvr_lightning.rewards.text import ContainsReward
    from rlvr_lightning.tools import Calculator

    policy = scripted_policy(tokenizer_dir, generation=GenerationOptions(tools=ToolUse([Calculator()])))
    module = RLVRModule(
        policy,
        group_size=4,
        optimizer=lambda params: torch.optim.SGD(params, lr=1.0),
        sampling=SamplingConfig(temperature=0.7, max_new_tokens=24),
        update=UpdateConfig(mini_batch_size=8, micro_batch_size=micro_batch_size),
        aggregation=AggregationConfig(mode="seq-mean-token-mean"),
    )
    pl.seed_everything(0)
    trainer = pl.Trainer(
        max_epochs=1, limit_train_batches=1, limit_val_batches=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    data = RLVRDataModule(InlineTask(EXAMPLES), batch_size=2)
    trainer.callbacks += [ContainsReward(target="5"), CenteredAdvantage()]
    trainer.fit(module, data)
    source = module.last_rollout.response_source
    holes = ((source == TokenSource.TOOL).long().cummax(-1).values.bool() & (source == TokenSource.SAMPLED)).any()
    return torch.cat([p.detach().flatten() for p in policy.parameters()]), bool(holes)


def test_micro_batching_is_exact_with_observation_holes(tmp_path):
    tokenizer_dir = save_tool_tokenizer(tmp_path / "tok")
    whole, holes = final_parameters(tokenizer_dir, None)
    assert holes  # some responses went on after an observation: masks with holes were trained on
    micro, _ = final_parameters(tokenizer_dir, 2)
    initial = torch.cat([p.detach().flatten() for p in scripted_policy(tokenizer_dir).parameters()])
    assert (whole - initial).abs().max() > 1e-5  # the update did something
    torch.testing.assert_close(whole, micro, atol=1e-6, rtol=1e-5)

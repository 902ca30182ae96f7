"""The language-model path learns: `rlvr fit` with `HFPolicy` and our sampling loop on a tiny random Llama.

The task (`rlvr_lightning/demos/named_digit.py`): repeat the digit the prompt names, 4 tokens; a random model
earns ~0.05. GRPO must take the mean reward from <= 0.2 (first step) to >= 0.8 (last 5 steps) within 60 steps on
two seeds and answer >= 80% of held-out prompts greedily; PPO, LoRA, asynchronous rollouts, bf16 sampling
(alone, and asynchronous with LoRA), sampling with `StaticCacheGeneration` (its step compiled), LUFFY's
groups with a demonstration and SPO's single responses must gain at least 0.4, far beyond noise (a step
averages 16 prompts x 16 responses x 4 positions: a few hundredths), and answer half the held-out prompts. The
negative tests break the update on purpose and check that the same run then does not learn.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from rlvr_lightning.core.losses.policy_losses import PPOClip
from rlvr_lightning.demos.named_digit import fit, fit_config, greedy_accuracy, mean, save_word_tokenizer
from rlvr_lightning.policies import hf_scoring

START, END = 1, 5
# our loop sampling from a bf16 copy of the fp32 weights
BF16_SAMPLING = {
    "class_path": "rlvr_lightning.generation.KVCacheGeneration",
    "init_args": {"dtype": "bfloat16"},
}  # steps averaged at the start (the untrained model's samples) and at the end of a run
# our loop over a static KV cache, its decoding step compiled as one graph (the CUDA default, here on a CPU)
STATIC = {
    "class_path": "rlvr_lightning.generation.StaticCacheGeneration",
    "init_args": {"compile": "aot_eager", "sync_every": 3},
}

# LUFFY: 15 sampled responses and the prompt's demonstration ("7 7 7 7") in each group of 16
LUFFY = {"demonstrations": {"per_group": 1, "template": " ".join(["{answer}"] * 4)}, "loss": "luffy"}
# FlowRL with the paper's learned log Z: a head on the language model's hidden states
FLOWRL_LEARNED = {"loss": {"class_path": "rlvr_lightning.core.FlowRL", "init_args": {"log_z": "learned"}}}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    return save_word_tokenizer(tmp_path_factory.mktemp("word_tokenizer"))


@pytest.mark.parametrize("seed", [0, 1])
def test_grpo_learns_to_repeat_the_named_digit(tokenizer_dir, tmp_path, seed):
    cli, curve = fit(fit_config(tokenizer_dir, seed, steps=60), tmp_path)
    start, end = mean(curve.rewards[:START]), mean(curve.rewards[-END:])
    assert start <= 0.2 and end >= 0.8, curve.rewards
    assert curve.accuracy_at_start <= 0.1
    assert greedy_accuracy(cli.model.policy) >= 0.8


@pytest.mark.parametrize(
    "module_class, module, policy, lr",
    [
        pytest.param("PPOModule", {"value": {"model": "separate"}}, {}, 2e-3, id="ppo"),
        pytest.param("RLVRModule", {}, {"lora": {"r": 8}}, 5e-3, id="lora"),
        pytest.param("RLVRModule", {"rollout_staleness": 1}, {}, 2e-3, id="async"),
        pytest.param(
            "RLVRModule",
            {"rollout_is": {"mode": "token_truncate"}},
            {"generation": {"backend": BF16_SAMPLING}},
            2e-3,
            id="bf16",
        ),
        pytest.param("RLVRModule", {}, {"generation": {"backend": STATIC}}, 2e-3, id="static"),
        pytest.param("RLVRModule", LUFFY, {}, 2e-3, id="luffy"),
        pytest.param("RLVRModule", FLOWRL_LEARNED, {}, 2e-3, id="flowrl_learned"),
        pytest.param("RLVRModule", {"loss": "simko", "aggregation": {"mode": "token-mean"}}, {}, 2e-3, id="simko"),
        pytest.param(
            "RLVRModule",
            {"rollout_staleness": 1},
            {"lora": {"r": 8}, "generation": {"backend": BF16_SAMPLING}},
            5e-3,
            id="bf16_async_lora",
        ),
    ],
)
def test_variants_learn(tokenizer_dir, tmp_path, module_class, module, policy, lr):
    from tests.generation.static_pairs import static_decoding_unsupported

    if policy.get("generation", {}).get("backend") is STATIC and static_decoding_unsupported():
        pytest.skip(static_decoding_unsupported())
    config = fit_config(tokenizer_dir, seed=0, steps=60, module_class=module_class, module=module, policy=policy, lr=lr)
    cli, curve = fit(config, tmp_path)
    start, end = mean(curve.rewards[:START]), mean(curve.rewards[-END:])
    assert start <= 0.2 and end >= start + 0.4, curve.rewards
    assert curve.accuracy_at_start <= 0.1 and greedy_accuracy(cli.model.policy) >= 0.5
    if policy.get("lora", {}).get("r"):
        assert all(not p.requires_grad for n, p in cli.model.policy.named_parameters() if "lora_" not in n)


def test_spo_learns_without_groups(tokenizer_dir, tmp_path):
    """SPO: one response per prompt (256 prompts a step, the same 256 responses), advantages from each prompt's
    tracked success probability, started from 4 responses of the policy and forgetting by its drift."""
    config = fit_config(tokenizer_dir, seed=0, steps=60, module={"group_size": 1}, batch_size=256)
    tracker = {"class_path": "rlvr_lightning.advantages.ValueTrackerAdvantage", "init_args": {"prior_samples": 4}}
    config["trainer"]["callbacks"].append(tracker)
    cli, curve = fit(config, tmp_path)
    start, end = mean(curve.rewards[:START]), mean(curve.rewards[-END:])
    assert start <= 0.2 and end >= start + 0.4, curve.rewards
    assert greedy_accuracy(cli.model.policy) >= 0.5
    estimator = cli.model.advantage_estimator
    assert estimator.last and all(record["log_probs"].numel() for record in estimator.last.values())


def _advantages_negated(monkeypatch):
    loss = PPOClip.__call__

    def negated(self, log_probs, old_log_probs, advantages, mask):
        return loss(self, log_probs, old_log_probs, -advantages, mask)

    monkeypatch.setattr(PPOClip, "__call__", negated)


def _tokens_shuffled_against_their_log_probs(monkeypatch):
    """The trainer scores other rows' responses than the ones that were sampled and rewarded."""
    score = hf_scoring.HFScoring._score

    def shuffled(self, rollout, *args, **kwargs):
        order = torch.randperm(rollout.num_rows, generator=torch.Generator().manual_seed(rollout.num_rows))
        moved = dataclasses.replace(
            rollout, response_ids=rollout.response_ids[order], response_mask=rollout.response_mask[order]
        )
        return score(self, moved, *args, **kwargs)

    monkeypatch.setattr(hf_scoring.HFScoring, "_score", shuffled)


@pytest.mark.parametrize(
    "bug",
    [
        pytest.param(_advantages_negated, id="advantages_negated"),
        pytest.param(_tokens_shuffled_against_their_log_probs, id="tokens_shuffled_against_log_probs"),
    ],
)
def test_a_broken_update_does_not_learn(tokenizer_dir, tmp_path, monkeypatch, bug):
    bug(monkeypatch)
    _, curve = fit(fit_config(tokenizer_dir, seed=0, steps=40), tmp_path)
    assert mean(curve.rewards[-END:]) <= mean(curve.rewards[:START]) + 0.05, curve.rewards

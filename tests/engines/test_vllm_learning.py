"""The language-model path learns with the vLLM engine sampling: `rlvr fit` on the task of
`rlvr_lightning/demos/named_digit.py` (repeat the named digit) with `VLLMGeneration`, as `tests/test_lm_learning.py`
checks it with our loop. An engine that never receives the trained weights must not learn."""

from __future__ import annotations

import pytest

from rlvr_lightning.demos.named_digit import fit, fit_config, greedy_accuracy, mean, model_config, save_word_tokenizer
from rlvr_lightning.generation.vllm_engine import VLLMGeneration

START, END = 1, 5  # steps averaged at the start (the untrained model's samples) and at the end of a run
ENGINE = {"class_path": "rlvr_lightning.generation.VLLMGeneration", "init_args": {"kv_cache_memory_gib": 0.0625}}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return save_word_tokenizer(tmp_path_factory.mktemp("word_tokenizer"))


def _engine_config(tokenizer_dir, seed: int, steps: int) -> dict:
    # head size 32: the smallest vLLM's CPU attention supports
    policy = {
        "model": {"config": model_config(hidden_size=128, intermediate_size=256)},
        "generation": {"backend": ENGINE},
    }
    return fit_config(tokenizer_dir, seed, steps=steps, policy=policy)


@pytest.mark.parametrize("seed", [0, 1])
def test_grpo_with_the_engine_learns_to_repeat_the_named_digit(tokenizer_dir, tmp_path, seed):
    cli, curve = fit(_engine_config(tokenizer_dir, seed, steps=60), tmp_path)
    assert isinstance(cli.model.policy.generation, VLLMGeneration)
    start, end = mean(curve.rewards[:START]), mean(curve.rewards[-END:])
    assert start <= 0.2 and end >= 0.8, curve.rewards
    assert curve.accuracy_at_start <= 0.1 and greedy_accuracy(cli.model.policy) >= 0.6


def test_an_engine_that_keeps_its_first_weights_does_not_learn(tokenizer_dir, tmp_path, monkeypatch):
    push = VLLMGeneration._push_if_changed

    def first_push_only(self, model):
        return push(self, model) if self.weight_pushes == 0 else 0.0

    monkeypatch.setattr(VLLMGeneration, "_push_if_changed", first_push_only)
    _, curve = fit(_engine_config(tokenizer_dir, seed=0, steps=30), tmp_path)
    assert mean(curve.rewards[-END:]) <= mean(curve.rewards[:START]) + 0.05, curve.rewards

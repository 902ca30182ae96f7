"""SequenceClassifierReward: a tiny random reward model; batched scores equal one-row scores; failures per row."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.demos.tiny_lm import EOS, save_tiny_tokenizer, tiny_llama_config
from rlvr_lightning.rewards.reward_model import SequenceClassifierReward
from tests.rewards.test_math_reward import make_rollout

RESPONSES = ["The answer is 5.", "ab", "A verifiable reward checks the final answer.", "1 2 3", "stop", "x y"]
PROMPTS = ["<|user|>What is 2+3?<|assistant|>"] * 3 + ["<|user|>Count<|assistant|>"] * 3


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return save_tiny_tokenizer(tmp_path_factory.mktemp("rm_tokenizer"))


TINY_GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256}  # absolute positions


def tiny_reward_model(tokenizer_dir, **kwargs):
    torch.manual_seed(0)
    config = {**kwargs.pop("base", tiny_llama_config()), **kwargs.pop("config", {})}
    return SequenceClassifierReward(config=config, tokenizer_name_or_path=str(tokenizer_dir), **kwargs)


def one_row_logits(reward, text):
    """The model's logits for one unpadded row, straight from transformers (no batching, no padding)."""
    ids = reward.tokenizer(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        return reward.model(input_ids=torch.tensor([ids])).logits[0].float()


@pytest.mark.parametrize("base", [tiny_llama_config(), TINY_GPT2], ids=["llama", "gpt2"])
def test_batched_scores_equal_each_row_scored_alone(tokenizer_dir, base):
    reward = tiny_reward_model(tokenizer_dir, base=base, batch_size=4)
    rollout = make_rollout(RESPONSES, prompts=PROMPTS)
    scores = reward(rollout)
    expected = [one_row_logits(reward, p + r)[0].item() for p, r in zip(PROMPTS, RESPONSES, strict=True)]
    # right padding: no row depends on its batch (left padding would shift GPT-2's absolute positions)
    assert scores.tolist() == pytest.approx(expected, abs=1e-5)
    assert len(set(round(s, 6) for s in expected)) == len(expected)  # and the rows do score differently
    assert reward.pop_errors() == 0 and reward.name == "reward_model" and reward.model.config.num_labels == 1
    squashed = tiny_reward_model(tokenizer_dir, base=base, sigmoid=True)
    assert squashed(rollout).tolist() == pytest.approx(torch.sigmoid(torch.tensor(expected)).tolist(), abs=1e-6)


def test_many_labels_give_the_probability_of_one(tokenizer_dir):
    reward = tiny_reward_model(tokenizer_dir, config={"num_labels": 3}, label=1, template="Q: {question} A: {response}")
    rollout = make_rollout(RESPONSES[:3], [{"question": "why?"}] * 3)
    expected = [torch.softmax(one_row_logits(reward, f"Q: why? A: {r}"), -1)[1].item() for r in RESPONSES[:3]]
    assert reward(rollout).tolist() == pytest.approx(expected, abs=1e-6)
    assert tiny_reward_model(tokenizer_dir, config={"num_labels": 3}).label == 2  # default: the last label
    with pytest.raises(ValueError, match="label must be in \\[0, 3\\)"):
        tiny_reward_model(tokenizer_dir, config={"num_labels": 3}, label=3)
    with pytest.raises(ValueError, match="sigmoid applies to a one-label model"):
        tiny_reward_model(tokenizer_dir, config={"num_labels": 3}, sigmoid=True)


def test_a_row_too_long_or_smuggling_tokens_costs_only_itself(tokenizer_dir):
    reward = tiny_reward_model(tokenizer_dir, max_length=12, batch_size=8)
    long = "The quick brown fox jumps over the lazy dog. " * 3
    rollout = make_rollout(["short", long, f"ok{EOS}"], prompts=["<|user|>Q<|assistant|>"] * 3)
    scores = reward(rollout)
    assert scores[1] == 0.0 and reward.pop_errors() == 1
    assert scores[0].item() == pytest.approx(one_row_logits(reward, "<|user|>Q<|assistant|>short")[0].item(), abs=1e-5)
    # the response's spelled-out EOS is removed; the prompt's chat tokens are kept
    assert scores[2].item() == pytest.approx(one_row_logits(reward, "<|user|>Q<|assistant|>ok")[0].item(), abs=1e-5)


def test_construction_errors(tokenizer_dir):
    with pytest.raises(ValueError, match="needs tokenizer_name_or_path"):
        SequenceClassifierReward(config=tiny_llama_config())
    with pytest.raises(ValueError, match="model_type"):
        SequenceClassifierReward(config={"hidden_size": 8}, tokenizer_name_or_path=str(tokenizer_dir))
    with pytest.raises(FileNotFoundError, match="rlvr-models fetch|not"):
        SequenceClassifierReward(model_name_or_path="/nonexistent/reward-model")

"""Multi-turn rollouts (a calculator call, a forced `</think>`) with a vLLM engine: the segments are
generated above the backend, so the engine gives what our loop gives on the same scripted weights."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from scripted_lm import save_tool_tokenizer, script_weights, transitions

from rlvr_lightning.multiturn.thinking_budget import ThinkingBudget
from rlvr_lightning.multiturn.tool_use import ToolUse
from rlvr_lightning.policies import SamplingConfig, VLLMGeneration
from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions, PromptOptions
from rlvr_lightning.rollout import TokenSource
from rlvr_lightning.tools import Calculator

from .conftest import engine_config

PROMPTS = ["What is 2+3?", "Say ab. What is 2+3?"]


@pytest.fixture(scope="module")
def tool_tokenizer_dir(tmp_path_factory):
    return save_tool_tokenizer(tmp_path_factory.mktemp("tool_tokenizer"))


def _pair(tokenizer_dir, script, generation_options=GenerationOptions(), **kwargs):
    """Two policies with the same scripted weights: our loop, and a vLLM engine."""
    from rlvr_lightning.policies.hf import HFPolicy

    policies = []
    for generation in (None, VLLMGeneration(kv_cache_memory_gib=0.0625, dtype="float32")):
        torch.manual_seed(0)
        policy = HFPolicy(
            model=HFModelOptions(config=engine_config(), tokenizer=str(tokenizer_dir)),
            generation=dataclasses.replace(generation_options, backend=generation),
            **kwargs,
        )
        script_weights(policy, script(policy.tokenizer), strength=8.0)
        policies.append(policy)
    return policies


def _calculator_script(tok):
    last = tok("?", add_special_tokens=False)["input_ids"][-1]
    return transitions(
        tok, [[last, "<calculator>2+3</calculator>"], ["</result>", "The answer is 5.", tok.eos_token_id]]
    )


def test_tool_rollouts_equal_our_loop(tool_tokenizer_dir):
    ours, theirs = _pair(
        tool_tokenizer_dir,
        _calculator_script,
        prompt=PromptOptions(template="raw"),
        generation_options=GenerationOptions(tools=ToolUse([Calculator()])),
    )
    greedy = SamplingConfig(do_sample=False, max_new_tokens=32)
    expected = ours.sample({"prompt": PROMPTS}, 1, greedy)  # vLLM samples greedily only with n = 1
    got = theirs.sample({"prompt": PROMPTS}, 1, greedy)
    assert (
        got.response_text
        == expected.response_text
        == ["<calculator>2+3</calculator><result>5</result>The answer is 5."] * 2
    )
    assert torch.equal(got.response_ids, expected.response_ids)
    assert torch.equal(got.response_source, expected.response_source)
    assert torch.equal(got.response_mask, expected.response_mask)
    assert (got.response_source == TokenSource.TOOL).any(-1).all()
    assert (got.sampling_log_probs - expected.sampling_log_probs).abs().max() <= 1e-4
    assert theirs.last_generation_stats["tool_calls/mean"] == 1.0 and theirs.last_generation_stats["rounds"] == 2.0


def _never_closes(tok):
    ab = tok(" ab", add_special_tokens=False)["input_ids"]
    newline = tok("\n", add_special_tokens=False)["input_ids"]
    return transitions(
        tok,
        [
            [*tok("<think>", add_special_tokens=False)["input_ids"], *ab, *ab],
            [*newline, "The answer is 5.", tok.eos_token_id],
        ],
    )


def test_the_thinking_budget_forces_the_close_in_the_engine(tool_tokenizer_dir):
    ours, theirs = _pair(
        tool_tokenizer_dir,
        _never_closes,
        prompt=PromptOptions(template="{prompt} <think>"),
        generation_options=GenerationOptions(thinking_budget=ThinkingBudget(5)),
    )
    greedy = SamplingConfig(do_sample=False, max_new_tokens=40)
    expected = ours.sample({"prompt": PROMPTS}, 1, greedy)
    got = theirs.sample({"prompt": PROMPTS}, 1, greedy)
    assert torch.equal(got.response_ids, expected.response_ids)
    assert torch.equal(got.response_source, expected.response_source)
    forced = len(theirs.tokenizer("\n</think>\n\n", add_special_tokens=False)["input_ids"])
    for row in got.response_source.tolist():
        assert row[: 5 + forced] == [TokenSource.SAMPLED] * 5 + [TokenSource.FORCED] * forced
    assert all(text.endswith("</think>\n\nThe answer is 5.") for text in got.response_text)
    assert theirs.last_generation_stats["thinking/forced_fraction"] == 1.0


def test_sampled_groups_carry_the_engines_log_probs_on_the_mixed_sequence(tool_tokenizer_dir):
    _, policy = _pair(
        tool_tokenizer_dir,
        _calculator_script,
        prompt=PromptOptions(template="raw"),
        generation_options=GenerationOptions(tools=ToolUse([Calculator()])),
    )
    torch.manual_seed(0)
    rollout = policy.sample({"prompt": PROMPTS}, 4, SamplingConfig(temperature=0.5, max_new_tokens=32))
    observed = rollout.response_source == TokenSource.TOOL
    assert ((observed.long().cummax(-1).values.bool()) & (rollout.response_source == TokenSource.SAMPLED)).any(
        -1
    ).sum() >= 2
    with torch.no_grad():
        trainer, _ = policy.token_log_probs(rollout, temperature=0.5)
    assert (trainer - rollout.sampling_log_probs).abs().max() <= 1e-4  # 0 = 0 on observations and padding
    assert rollout.sampling_log_probs[rollout.response_mask == 0].eq(0).all()


def test_the_engine_caps_each_prompt_on_its_own(make_policy):
    policy = make_policy(
        generation=GenerationOptions(backend=VLLMGeneration(kv_cache_memory_gib=0.0625, dtype="float32"))
    )
    ids, _ = policy.encode_prompts(["ab", "The quick brown fox"])
    out = policy.generation.generate(
        policy.model, policy.tokenizer, ids, 2, SamplingConfig(max_new_tokens=6),
        eos_token_ids=[], pad_token_id=policy.pad_token_id, max_new_tokens=[2, 5],
    )  # fmt: skip
    assert out.response_mask.sum(-1).tolist() == [2, 2, 5, 5]
    assert out.truncated.all()

"""The vLLM engine samples the distribution our loop samples, on the same weights: 10,000 completions of one
prompt from each, their first and second tokens and length classes compared by chi-square tests at level 1e-4
(`tests/policies/sampling_distribution.py`). A deliberately wrong engine request (temperature squared) must fail.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from sampling_distribution import compare, peak_distribution, policy_sample

from rlvr_lightning.policies import VLLMGeneration
from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions, PromptOptions

SAMPLES = 10_000
MAX_NEW_TOKENS = 8
PROMPT = "What is 2+3?"
LONGER_PROMPTS = ["The quick brown fox jumps over", "Group relative policy optimisation samples several answers"]


@pytest.fixture(scope="module")
def policies(tokenizer_dir):
    """Two policies with the same peaked weights: one samples with our loop, the other with an fp32 engine."""
    from rlvr_lightning.policies.hf import HFPolicy

    from .conftest import engine_config

    def make(**kwargs):
        torch.manual_seed(3)
        policy = HFPolicy(
            model=HFModelOptions(config=engine_config(), tokenizer=str(tokenizer_dir)),
            prompt=PromptOptions(template="raw"),
            **kwargs,
        )
        peak_distribution(policy.model, policy.eos_token_ids[0])
        return policy

    ours = make()
    engine = make(generation=GenerationOptions(backend=VLLMGeneration(dtype="float32", kv_cache_memory_gib=0.25)))
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), engine.state_dict().values(), strict=True))
    tokenizer = ours.tokenizer
    prompts = {
        "prompt": tokenizer(PROMPT)["input_ids"],
        "longer_prompts": [tokenizer(t)["input_ids"] for t in LONGER_PROMPTS],
    }
    return ours, engine, prompts


@pytest.mark.parametrize(
    "layout, temperature, seed", [("one_group", 1.0, 1), ("left_padded", 1.0, 2), ("one_group", 0.7, 3)]
)
def test_the_engine_samples_our_loop_s_distribution(policies, layout, temperature, seed):
    ours, engine, prompts = policies
    theirs = policy_sample(
        engine,
        layout=layout,
        num_samples=SAMPLES,
        max_new_tokens=MAX_NEW_TOKENS,
        temperature=temperature,
        seed=seed,
        **prompts,
    )
    mine = policy_sample(
        ours,
        layout=layout,
        num_samples=SAMPLES,
        max_new_tokens=MAX_NEW_TOKENS,
        temperature=temperature,
        seed=seed + 100,
        **prompts,
    )
    for name, (statistic, threshold) in compare(theirs, mine).items():
        assert statistic < threshold, f"{layout}, T={temperature}: {name} chi-square {statistic:.1f} >= {threshold:.1f}"


def test_an_engine_sampling_at_the_wrong_temperature_fails(policies, monkeypatch):
    ours, engine, prompts = policies
    generate = VLLMGeneration.generate

    def squared_temperature(self, model, tokenizer, prompt_token_ids, n, sampling, **kwargs):
        sampling = dataclasses.replace(sampling, temperature=sampling.temperature**2)
        return generate(self, model, tokenizer, prompt_token_ids, n, sampling, **kwargs)

    monkeypatch.setattr(VLLMGeneration, "generate", squared_temperature)
    theirs = policy_sample(
        engine,
        layout="one_group",
        num_samples=SAMPLES,
        max_new_tokens=MAX_NEW_TOKENS,
        temperature=0.7,
        seed=4,
        **prompts,
    )
    mine = policy_sample(
        ours,
        layout="one_group",
        num_samples=SAMPLES,
        max_new_tokens=MAX_NEW_TOKENS,
        temperature=0.7,
        seed=104,
        **prompts,
    )
    results = compare(theirs, mine)
    statistic, threshold = results["first_token"]
    assert statistic > threshold, results

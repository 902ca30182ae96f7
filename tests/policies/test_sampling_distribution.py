"""Our sampling loop draws completions from the model's own distribution, whatever the group size, prompt
sharing, batch composition (left padding) and temperature.

Each condition samples 10,000 completions of one prompt through `HFPolicy.sample` and compares their first and
second tokens and length classes with those of `reference_sample` (a full forward per step, no cache, no
padding) by chi-square tests at level 1e-4 each. The layouts (`sampling_distribution.policy_sample`) cover group
sizes 10,000, 16 and 1, a prompt prefilled once for its group or once per row (the loop shares a prompt's prefill
within its group; `HFPolicy(share_prompt_prefix)` concerns scoring), and the prompt left-padded among longer
ones. The negative tests break the loop on purpose and check that the same comparison notices: the test has the
power to catch a wrong sampler, not only to pass a right one.
"""

from __future__ import annotations

import math

import pytest
import torch
from sampling_distribution import (
    Completions,
    chi2_upper_quantile,
    compare,
    homogeneity_chi2,
    peak_distribution,
    policy_sample,
    reference_sample,
)

from rlvr_lightning.demos.tiny_lm import tiny_llama_config
from rlvr_lightning.generation import kv_cache
from rlvr_lightning.generation import loop as generation
from rlvr_lightning.policies.hf_options import HFModelOptions, PromptOptions

SAMPLES = 10_000
MAX_NEW_TOKENS = 8
PROMPT = "What is 2+3?"
LONGER_PROMPTS = ["The quick brown fox jumps over", "Group relative policy optimisation samples several answers"]


@pytest.fixture(scope="module")
def setup(tokenizer_dir):
    """The peaked tiny Llama, the prompt's token ids, and a cache of reference samples per temperature."""
    from rlvr_lightning.policies.hf import HFPolicy

    torch.manual_seed(3)
    policy = HFPolicy(
        model=HFModelOptions(config=tiny_llama_config(), tokenizer=str(tokenizer_dir)),
        prompt=PromptOptions(template="raw"),
    )
    peak_distribution(policy.model, policy.eos_token_ids[0])
    prompt = policy.tokenizer(PROMPT)["input_ids"]
    others = [policy.tokenizer(text)["input_ids"] for text in LONGER_PROMPTS]
    assert all(len(other) > len(prompt) + 3 for other in others)  # the prompt is left-padded among them
    return {"policy": policy, "prompt": prompt, "others": others, "references": {}}


def reference(setup, temperature: float) -> Completions:
    cache = setup["references"]
    if temperature not in cache:
        policy = setup["policy"]
        generator = torch.Generator().manual_seed(1000)
        cache[temperature] = reference_sample(
            policy.model, setup["prompt"], SAMPLES, MAX_NEW_TOKENS, policy.eos_token_ids, temperature, generator
        )
    return cache[temperature]


def ours(setup, layout: str, temperature: float = 1.0, seed: int = 0) -> Completions:
    return policy_sample(
        setup["policy"], setup["prompt"], layout, SAMPLES, MAX_NEW_TOKENS, temperature, seed, setup["others"]
    )


def test_the_peaked_model_varies_in_first_token_and_length(setup):
    sample = reference(setup, 1.0)
    first = sample.first_counts().double() / len(sample)
    assert 10 <= math.exp(-(first[first > 0] * first[first > 0].log()).sum()) <= 30  # perplexity: 10-30 plausible
    lengths = sample.length_counts().double() / len(sample)
    assert (lengths[:MAX_NEW_TOKENS] > 0.03).sum() >= 6 and lengths[-1] < 0.5  # varied lengths; most end with EOS


@pytest.mark.parametrize(
    "layout, temperature, seed",
    [
        ("one_group", 1.0, 1),
        ("groups_of_16", 1.0, 2),
        ("no_sharing", 1.0, 3),
        ("left_padded", 1.0, 4),
        ("one_group", 0.7, 5),
    ],
)
def test_our_loop_samples_the_reference_distribution(setup, layout, temperature, seed):
    # a seed of its own per layout: independent samples, so that each comparison is a test of its own
    results = compare(ours(setup, layout, temperature, seed), reference(setup, temperature))
    for name, (statistic, threshold) in results.items():
        assert statistic < threshold, f"{layout}, T={temperature}: {name} chi-square {statistic:.1f} >= {threshold:.1f}"


def _temperature_applied_twice(monkeypatch):
    sample = generation.sample_next_token

    def broken(logits, temperature=1.0, *args, **kwargs):
        return sample(logits / temperature, temperature, *args, **kwargs)

    monkeypatch.setattr(generation, "sample_next_token", broken)


def _shared_cache_loses_the_last_prompt_token(monkeypatch):
    """When a prompt's cache is repeated for its group, its last position is overwritten by the one before."""
    layer = kv_cache._growing_layer_class()
    repeat = layer.batch_repeat_interleave

    def broken(self, repeats):
        repeat(self, repeats)
        self.key_room[..., self.length - 1, :] = self.key_room[..., self.length - 2, :]
        self.value_room[..., self.length - 1, :] = self.value_room[..., self.length - 2, :]

    monkeypatch.setattr(layer, "batch_repeat_interleave", broken)


def _padding_mask_off_by_one(monkeypatch):
    """Each left-padded row's attention mask starts one pad token early."""
    left_pad = generation.left_pad

    def broken(sequences, pad_id):
        ids, mask = left_pad(sequences, pad_id)
        starts = mask.argmax(-1)
        padded = (starts > 0).nonzero().squeeze(-1)
        mask[padded, starts[padded] - 1] = 1
        return ids, mask

    monkeypatch.setattr(generation, "left_pad", broken)


@pytest.mark.parametrize(
    "bug, layout, temperature, detected_by",
    [
        pytest.param(_temperature_applied_twice, "one_group", 0.7, "first_token", id="temperature_twice"),
        pytest.param(
            _shared_cache_loses_the_last_prompt_token,
            "one_group",
            1.0,
            "length",
            id="shared_cache_drops_last_prompt_token",
        ),
        pytest.param(_padding_mask_off_by_one, "left_padded", 1.0, "first_token", id="padding_mask_off_by_one"),
    ],
)
def test_a_broken_loop_fails_the_comparison(setup, monkeypatch, bug, layout, temperature, detected_by):
    bug(monkeypatch)
    results = compare(ours(setup, layout, temperature), reference(setup, temperature))
    statistic, threshold = results[detected_by]
    assert statistic > threshold, results


def test_the_threshold_is_conservative():
    # the exact chi-square quantile from the regularised upper incomplete gamma function, by bisection
    def exact(df: int, tail: float = 1e-4) -> float:
        low, high = 0.0, 20.0 * df + 100.0
        for _ in range(100):
            middle = (low + high) / 2
            upper = torch.special.gammaincc(
                torch.tensor(df / 2, dtype=torch.float64), torch.tensor(middle / 2, dtype=torch.float64)
            )
            low, high = (middle, high) if upper > tail else (low, middle)
        return low

    for df in [1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 400]:
        assert exact(df) <= chi2_upper_quantile(df) <= exact(df) * 1.08, df


def test_homogeneity_statistic_by_hand():
    # 2 x 2 table [[30, 10], [20, 40]]: E = [[20, 20], [30, 30]]; sum (O - E)^2 / E = 5 + 5 + 10/3 + 10/3
    statistic, df = homogeneity_chi2(torch.tensor([30, 10]), torch.tensor([20, 40]))
    assert statistic == pytest.approx(50 / 3) and df == 1
    # categories expected below 5 times are merged: [1, 0] and [0, 2] become one category
    statistic, df = homogeneity_chi2(torch.tensor([30, 10, 1, 0]), torch.tensor([20, 40, 0, 2]))
    assert df == 2

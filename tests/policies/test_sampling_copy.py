"""What asynchronous rollouts need from a policy: sampling from a generator of its own (the global one
untouched), and a sampling copy that shares the frozen weights and takes the trained ones on a push."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules.async_rollouts import copy_weights
from rlvr_lightning.multiturn.thinking_budget import ThinkingBudget
from rlvr_lightning.policies.hf_options import GenerationOptions, LoRAOptions, PromptOptions
from rlvr_lightning.policies.toy_sort import ToySortPolicy

PROMPTS = {"prompt": ["What is 2+3?", "The quick brown"], "metadata": [{}, {}]}
SAMPLING = SamplingConfig(max_new_tokens=6)


def _draws(policy, batch, seed: int):
    """Two samples with equally seeded generators, and whether the global RNG state moved meanwhile."""
    state = torch.get_rng_state()
    first = policy.sample(batch, 4, SAMPLING, generator=torch.Generator().manual_seed(seed))
    second = policy.sample(batch, 4, SAMPLING, generator=torch.Generator().manual_seed(seed))
    return first, second, torch.equal(state, torch.get_rng_state())


@pytest.mark.parametrize("kind", ["toy", "hf", "segments"])
def test_sampling_draws_from_the_given_generator_only(kind, make_policy):
    if kind == "toy":
        torch.manual_seed(0)
        policy, batch = ToySortPolicy(vocab_size=5, prompt_length=3), {"prompt": [[1, 2, 3], [4, 0, 2]]}
    elif kind == "hf":
        policy, batch = make_policy(prompt=PromptOptions(template="raw")), PROMPTS
    else:  # generated in segments (tools, thinking budget): the generator reaches every round
        policy, batch = (
            make_policy(
                prompt=PromptOptions(template="raw"),
                generation=GenerationOptions(thinking_budget=ThinkingBudget(max_thinking_tokens=2)),
            ),
            PROMPTS,
        )
    first, second, global_untouched = _draws(policy, batch, seed=7)
    assert global_untouched  # the training thread's generator is not consumed
    assert torch.equal(first.response_ids, second.response_ids)
    other, _, _ = _draws(policy, batch, seed=8)
    assert not torch.equal(first.response_ids, other.response_ids)
    # without a generator: the global one, as before
    torch.manual_seed(3)
    expected = policy.sample(batch, 4, SAMPLING).response_ids
    torch.manual_seed(3)
    assert torch.equal(policy.sample(batch, 4, SAMPLING, generator=None).response_ids, expected)


@pytest.mark.parametrize("lora", [False, True])
def test_the_sampling_copy_shares_frozen_weights_and_takes_the_trained_ones(make_policy, lora):
    policy = make_policy(prompt=PromptOptions(template="raw"), **{"lora": LoRAOptions(r=4)} if lora else {})
    copy = policy.sampling_copy()
    assert copy is not policy and copy.tokenizer is policy.tokenizer and copy.generation is policy.generation
    live = dict(policy.named_parameters())
    shared = [name for name, p in copy.named_parameters() if p is live[name]]
    trainable = [name for name, p in policy.named_parameters() if p.requires_grad]
    assert set(shared) == set(live) - set(trainable)  # LoRA: everything but the adapter; else nothing
    assert bool(shared) == lora
    with torch.no_grad():
        for name in trainable:
            live[name].add_(0.01)
    assert not all(torch.equal(live[name], p) for name, p in copy.named_parameters())
    copy_weights(policy, copy)
    assert all(torch.equal(live[name], p) for name, p in copy.named_parameters())
    torch.manual_seed(0)
    expected = policy.sample(PROMPTS, 2, SAMPLING).response_ids
    torch.manual_seed(0)
    assert torch.equal(copy.sample(PROMPTS, 2, SAMPLING).response_ids, expected)

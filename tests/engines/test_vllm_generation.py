"""`VLLMGeneration` against our own loop on the same weights (fp32 engine, vLLM's CPU build in CI)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from rlvr_lightning.policies import KVCacheGeneration, SamplingConfig, VLLMGeneration
from rlvr_lightning.policies.hf_options import GenerationOptions, LoRAOptions
from rlvr_lightning.serving.vllm_weights import named_weights

PROMPTS = ["What is 2+3?", "The quick brown", "Say ab.", "Numbers: 0 1 2"]
GREEDY = SamplingConfig(do_sample=False, max_new_tokens=10)


def engine(**kwargs) -> VLLMGeneration:
    kwargs.setdefault("kv_cache_memory_gib", 0.0625)
    kwargs.setdefault("dtype", "float32")
    return VLLMGeneration(**kwargs)


def _perturb(policy, scale: float = 0.05, seed: int = 1) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in policy.model.parameters():
            if param.requires_grad:
                param.add_(torch.randn(param.shape, generator=generator) * scale)


def _responses(rollout) -> list[list[int]]:
    lengths = rollout.response_mask.sum(-1).long().tolist()
    return [row[:length] for row, length in zip(rollout.response_ids.tolist(), lengths, strict=True)]


def _same_policy_two_backends(make_policy, **kwargs):
    """Two policies with identical weights: one samples with vLLM, the other with our loop."""
    ours = make_policy(**kwargs)
    theirs = make_policy(generation=GenerationOptions(backend=engine()), **kwargs)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def test_greedy_equals_our_loop_after_each_weight_push(make_policy):
    ours, theirs = _same_policy_two_backends(make_policy)
    batch = {"prompt": PROMPTS}
    assert _responses(theirs.sample(batch, 1, GREEDY)) == _responses(ours.sample(batch, 1, GREEDY))
    assert theirs.generation.weight_pushes == 1

    theirs.sample(batch, 1, GREEDY)
    assert theirs.generation.weight_pushes == 1  # unchanged weights are not pushed again

    # an "update": both policies move the same way; the engine must follow
    before = _responses(theirs.sample(batch, 1, GREEDY))
    _perturb(ours)
    _perturb(theirs)
    after = _responses(theirs.sample(batch, 1, GREEDY))
    assert theirs.generation.weight_pushes == 2
    assert after == _responses(ours.sample(batch, 1, GREEDY))
    assert after != before  # the push changed what the engine generates


def test_a_fused_optimizer_step_triggers_a_push(make_policy):
    policy = make_policy(generation=GenerationOptions(backend=engine()))
    batch = {"prompt": PROMPTS[:2]}
    policy.sample(batch, 1, GREEDY)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2, fused=True)  # fused: no version-counter bump
    for param in policy.parameters():
        param.grad = torch.ones_like(param)
    optimizer.step()
    policy.sample(batch, 1, GREEDY)
    assert policy.generation.weight_pushes == 2


def test_engine_log_probs_match_the_trainer(make_policy):
    _, policy = _same_policy_two_backends(make_policy)
    sampling = SamplingConfig(temperature=0.7, max_new_tokens=12)
    rollout = policy.sample({"prompt": PROMPTS}, 3, sampling)
    assert rollout.sampling_log_probs is not None and rollout.old_log_probs is None
    assert policy.sampling_log_probs_exact  # fp32 engine, no top-k/top-p: usable as old log-probs
    with torch.no_grad():
        trainer, _ = policy.token_log_probs(rollout, temperature=0.7)
    mask = rollout.response_mask.bool()
    assert (trainer - rollout.sampling_log_probs)[mask].abs().max() <= 1e-4
    assert rollout.sampling_log_probs[~mask].eq(0).all()


def test_filtered_sampling_or_a_bf16_engine_is_not_exact(make_policy):
    policy = make_policy(generation=GenerationOptions(backend=engine()))
    with pytest.warns(UserWarning, match="renormalised over the kept tokens"):
        filtered = policy.sample({"prompt": PROMPTS[:1]}, 2, SamplingConfig(top_p=0.9, max_new_tokens=4))
    assert not policy.sampling_log_probs_exact  # the engine's log-probs are of the filtered distribution
    # vLLM renormalises its processed log-probs over the kept tokens: they are not recorded for importance sampling
    assert filtered.sampling_log_probs is None
    bf16 = make_policy(generation=GenerationOptions(backend=engine(dtype="bfloat16")))
    bf16.sample({"prompt": PROMPTS[:1]}, 2, SamplingConfig(max_new_tokens=4))
    assert not bf16.sampling_log_probs_exact


def test_eos_and_stop_strings_end_rows_as_our_loop_does(make_policy):
    ours, theirs = _same_policy_two_backends(make_policy)
    batch = {"prompt": PROMPTS}
    # make "EOS" a token that greedy decoding reaches, so that rows end early
    free = _responses(ours.sample(batch, 1, GREEDY))
    eos = free[0][3]
    ours.eos_token_ids = theirs.eos_token_ids = [eos]
    expected = ours.sample(batch, 1, GREEDY)
    got = theirs.sample(batch, 1, GREEDY)
    assert _responses(got) == _responses(expected)
    assert _responses(got)[0][-1] == eos  # the EOS token is part of the response (mask 1 through it)
    assert torch.equal(got.truncated, expected.truncated)

    text = expected.response_text[1]
    stop = SamplingConfig(do_sample=False, max_new_tokens=10, stop_strings=[text[2:4]]) if len(text) >= 4 else None
    if stop is not None:
        expected, got = ours.sample(batch, 1, stop), theirs.sample(batch, 1, stop)
        assert _responses(got) == _responses(expected)
        assert got.response_text == expected.response_text


def test_lora_policy_pushes_merged_weights_and_keeps_its_base(make_policy):
    policy = make_policy(lora=LoRAOptions(r=4), generation=GenerationOptions(backend=engine()))
    with torch.no_grad():  # a trained-looking adapter (peft starts with B = 0, a no-op)
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    base_before = {k: v.clone() for k, v in policy.base_model.state_dict().items() if "lora_" not in k}
    ours = make_policy(lora=LoRAOptions(r=4))
    ours.load_state_dict(policy.state_dict())
    batch = {"prompt": PROMPTS}
    assert _responses(policy.sample(batch, 1, GREEDY)) == _responses(ours.sample(batch, 1, GREEDY))
    after = policy.base_model.state_dict()
    assert all(torch.equal(value, after[name]) for name, value in base_before.items())  # merged out of place
    names = dict(named_weights(policy.model))
    assert not any("lora" in name or "base_layer" in name for name in names)
    assert "model.layers.0.self_attn.q_proj.weight" in names


def test_engine_start_leaves_the_training_process_as_it_was(make_policy):
    policy = make_policy(generation=GenerationOptions(backend=engine(seed=123)))
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    policy.generation._ensure_engine(policy.model, policy.tokenizer)
    assert (
        torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1] and np.random.rand() == expected[2]
    )
    torch.set_num_threads(2)
    assert torch.get_num_threads() == 2  # vLLM's CPU worker replaces set_num_threads with a no-op; we restore it
    torch.set_num_threads(1)


def test_sampling_follows_the_global_seed(make_policy):
    policy = make_policy(generation=GenerationOptions(backend=engine()))
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=8)
    torch.manual_seed(3)
    first = _responses(policy.sample({"prompt": PROMPTS}, 4, sampling))
    torch.manual_seed(3)
    again = _responses(policy.sample({"prompt": PROMPTS}, 4, sampling))
    assert first == again
    assert len({tuple(row) for row in first[:4]}) > 1  # the n samples of a prompt differ


def test_sleep_mode_is_a_no_op_with_a_warning_on_cpu(make_policy):
    if torch.cuda.is_available():
        pytest.skip("CPU behaviour")
    policy = make_policy(generation=GenerationOptions(backend=engine(sleep_level=1)))
    with pytest.warns(UserWarning, match="no sleep mode"):
        rollout = policy.sample({"prompt": PROMPTS[:1]}, 2, SamplingConfig(max_new_tokens=4))
    assert rollout.num_rows == 2 and not policy.generation._asleep


def test_bad_options_name_the_choices():
    with pytest.raises(ValueError, match="dtype='fp8' is not valid; choose one of"):
        VLLMGeneration(dtype="fp8")
    with pytest.raises(ValueError, match="sleep_level must be 0, 1 or 2"):
        VLLMGeneration(sleep_level=3)


def test_our_loop_is_still_the_default(make_policy):
    assert isinstance(make_policy().generation, KVCacheGeneration)

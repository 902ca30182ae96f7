"""`dtype: auto` under `bf16-mixed` (`generation/sampling_precision.py`'s autocast copy): the policy samples through a
copy whose plain linear layers hold bf16 weights and biases and whose other parameters are the model's own, under
the caller's autocast. Autocast casts a linear layer's operands to bf16 anyway (rounding as `.to(bf16)` does), so
the copy samples exactly what the model itself samples there: the same tokens, bit-identical log-probs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rlvr_lightning.demos.tiny_lm import tiny_llama_config
from rlvr_lightning.generation import KVCacheGeneration, StaticCacheGeneration
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.generation.sampling_precision import SamplingWeights
from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions, LoRAOptions, PromptOptions

PROMPTS = {"prompt": ["What is 2+3?", "The quick brown"], "metadata": [{}, {}]}
SAMPLING = SamplingConfig(max_new_tokens=8, temperature=0.9)
MODELS = {
    "llama": {},
    "tied": {"model": HFModelOptions(config=tiny_llama_config(tie_word_embeddings=True))},
    "qwen2_biases": {"model": HFModelOptions(config=tiny_llama_config(model_type="qwen2"))},
    "float32_head": {"model": HFModelOptions(lm_head_fp32=True)},
    "plain_layers": {"model": HFModelOptions(lean_activations=False)},
    "lora": {"lora": LoRAOptions(r=4)},
}
BACKENDS = {"eager": KVCacheGeneration, "static": StaticCacheGeneration}


def autocast():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def policy_with(make_policy, backend: str, model: str):
    return make_policy(
        generation=GenerationOptions(backend=BACKENDS[backend]()), prompt=PromptOptions(template="raw"), **MODELS[model]
    )


def sample(policy, seed: int, monkeypatch=None):
    """A rollout under bf16 autocast; with `monkeypatch`, from the model itself (no copy: the reference)."""
    with pytest.MonkeyPatch.context() as patch:
        if monkeypatch:
            patch.setattr(SamplingWeights, "model_for", lambda self, model, dtype: model)
        torch.manual_seed(seed)
        with autocast():
            return policy.sample(PROMPTS, 3, SAMPLING)


def assert_identical(a, b) -> None:
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)
    assert torch.equal(a.sampling_log_probs, b.sampling_log_probs)


def the_copy(policy):
    (entry,) = policy.generation._weights._copies.values()
    return entry.sampler


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_the_autocast_copy_samples_exactly_as_the_model_under_autocast(make_policy, backend, model):
    policy = policy_with(make_policy, backend, model)
    reference = sample(policy, seed=0, monkeypatch=True)
    assert not policy.generation._weights._copies
    rollout = sample(policy, seed=0)
    assert_identical(rollout, reference)
    copy, base = the_copy(policy), policy.model
    shared = {p.data_ptr() for p in base.parameters()}
    for (name, module), original in zip(copy.named_modules(), base.modules(), strict=True):
        for p, q in zip(module.parameters(recurse=False), original.parameters(recurse=False), strict=True):
            if type(module) is nn.Linear:  # cast, and its own storage
                assert p.dtype == torch.bfloat16 and torch.equal(p, q.detach().to(torch.bfloat16)), name
                assert p.data_ptr() not in shared, name
            else:  # the embeddings, norms, a float32 head: the model's own parameters
                assert p is q, name
    assert policy.training and not copy.training


def test_without_autocast_the_model_samples_itself(make_policy):
    policy = policy_with(make_policy, "eager", "llama")
    policy.sample(PROMPTS, 2, SAMPLING)
    assert not policy.generation._weights._copies


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_the_autocast_copy_follows_an_optimizer_step_and_a_replaced_weight(make_policy, backend):
    policy = policy_with(make_policy, backend, "tied")
    rollout = sample(policy, seed=0)
    copy = the_copy(policy)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=0.5)
    rollout.response_ids.fill_(7)  # a large step towards token 7
    log_probs, _ = policy.token_log_probs(rollout)
    (-(log_probs * rollout.response_mask).sum()).backward()
    optimizer.step()
    assert_identical(sample(policy, seed=1), sample(policy, seed=1, monkeypatch=True))
    assert the_copy(policy) is copy  # refreshed in place
    head = policy.base_model.get_output_embeddings()
    head.weight = nn.Parameter(torch.randn_like(head.weight))  # untied, a new object
    assert_identical(sample(policy, seed=2), sample(policy, seed=2, monkeypatch=True))
    assert the_copy(policy) is not copy  # built anew: the old one shared the replaced parameter


def test_the_compiled_static_step_reads_the_autocast_copy_in_place(make_policy):
    """The copy's cast weights keep their storage through an update (a CUDA graph keeps reading them): its step,
    compiled once (`fullgraph=True`, no graph break), samples as the model itself before and after."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    backend = StaticCacheGeneration(compile="aot_eager")
    policy = make_policy(generation=GenerationOptions(backend=backend), prompt=PromptOptions(template="raw"))
    for update in range(2):
        rollout = sample(policy, seed=update)
        reference = sample(policy, seed=update, monkeypatch=True)
        assert torch.equal(rollout.response_ids, reference.response_ids)
        assert (rollout.sampling_log_probs - reference.sampling_log_probs).abs().max() <= 1e-5
        pointers = [p.data_ptr() for p in the_copy(policy).parameters()]
        with torch.no_grad():
            for p in policy.parameters():
                p.mul_(1.1)  # an update of every weight
        sample(policy, seed=0)  # refreshes the copy
        assert [p.data_ptr() for p in the_copy(policy).parameters()] == pointers
    # one graph for the copy, one for the model itself (the reference): none compiled again after an update
    assert counters["stats"]["unique_graphs"] == 2 and not counters["graph_break"]
    torch._dynamo.reset()

"""A LoRA policy's adapter pushed alone to the colocated vLLM engine (`VLLMGeneration(lora_sync=adapter)`): the
engine samples under the adapter with the trainer's log-probs, and a push after an update sends the adapter's
tensors only."""

from __future__ import annotations

import torch

from rlvr_lightning.policies import SamplingConfig, VLLMGeneration
from rlvr_lightning.policies.hf_options import GenerationOptions, LoRAOptions
from rlvr_lightning.serving.lora_sync import adapter_tensors, tensor_bytes
from rlvr_lightning.serving.vllm_weights import named_weights

PROMPTS = ["What is 2+3?", "The quick brown", "Say ab.", "Numbers: 0 1 2"]
SAMPLING = SamplingConfig(temperature=0.7, max_new_tokens=12)


def engine(**kwargs) -> VLLMGeneration:
    return VLLMGeneration(kv_cache_memory_gib=0.0625, dtype="float32", **kwargs)


def _train_adapter(policy, seed: int) -> None:
    """An update's worth of change to the adapter (lora_B starts at zero: the adapter would be the identity)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_" in name and ".default." in name:
                param.add_(torch.randn(param.shape, generator=generator) * 0.2)


def _max_log_prob_gap(policy) -> float:
    rollout = policy.sample({"prompt": PROMPTS}, 3, SAMPLING)
    with torch.no_grad():
        trainer, _ = policy.token_log_probs(rollout, temperature=SAMPLING.temperature)
    mask = rollout.response_mask.bool()
    return (trainer - rollout.sampling_log_probs)[mask].abs().max().item()


def test_the_engine_samples_under_the_pushed_adapter_with_the_trainers_log_probs(make_policy):
    policy = make_policy(lora=LoRAOptions(r=4), generation=GenerationOptions(backend=engine(lora_sync="adapter")))
    backend = policy.generation
    _train_adapter(policy, seed=1)
    assert _max_log_prob_gap(policy) <= 1e-4
    assert backend._weights.adapter and backend._llm.llm_engine.list_loras() == {1}
    merged_bytes = tensor_bytes(tensor for _, tensor in named_weights(policy.model, torch.float32))
    adapter_bytes = tensor_bytes(adapter_tensors(policy.model, torch.float32).values())
    # the first push: the base weights (the engine started from dummy ones) and the adapter
    base_bytes = tensor_bytes(t for _, t in named_weights(policy.model, torch.float32, merge_lora=False))
    assert backend._weights.last_bytes == base_bytes + adapter_bytes

    _train_adapter(policy, seed=2)  # an update: only the adapter moves
    assert _max_log_prob_gap(policy) <= 1e-4
    assert backend.weight_pushes == 2
    assert backend._weights.last_bytes == adapter_bytes < merged_bytes / 10


def test_adapter_and_merged_pushes_sample_the_same_tokens(make_policy):
    adapter = make_policy(lora=LoRAOptions(r=4), generation=GenerationOptions(backend=engine(lora_sync="adapter")))
    merged = make_policy(lora=LoRAOptions(r=4), generation=GenerationOptions(backend=engine(lora_sync="merged")))
    _train_adapter(adapter, seed=3)
    merged.load_state_dict(adapter.state_dict())
    generator = torch.Generator().manual_seed(0)
    first = adapter.sample({"prompt": PROMPTS}, 2, SAMPLING, generator=generator)
    generator = torch.Generator().manual_seed(0)
    second = merged.sample({"prompt": PROMPTS}, 2, SAMPLING, generator=generator)
    assert torch.equal(first.response_ids, second.response_ids)
    mask = first.response_mask.bool()
    assert (first.sampling_log_probs - second.sampling_log_probs)[mask].abs().max() <= 1e-4
    assert not merged.generation._weights.adapter
    assert merged.generation._weights.last_bytes == tensor_bytes(t for _, t in named_weights(merged.model))

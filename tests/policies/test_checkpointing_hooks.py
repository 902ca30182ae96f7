"""Gradient checkpointing without the input embeddings' `requires_grad_` hook: transformers adds it when it turns
checkpointing on, PEFT when it wraps a checkpointed model; only reentrant checkpointing needs it, ours is not, and
dynamo cannot trace it, so it kept the compiled decoding step (`StaticCacheGeneration`) off checkpointed policies."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.policies.hf_loading import INPUT_GRAD_HOOKS
from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions, LoRAOptions, PromptOptions

PROMPTS = {"prompt": ["What is 2+3?", "Say ab."]}


def input_grad_hooks(model: torch.nn.Module) -> list[str]:
    return [
        hook.__name__
        for module in model.modules()
        for hook in module._forward_hooks.values()
        if getattr(hook, "__name__", None) in INPUT_GRAD_HOOKS
    ]


def scored_gradients(policy, rollout) -> dict[str, torch.Tensor]:
    policy.train()
    policy.zero_grad(set_to_none=True)
    log_probs, _ = policy.token_log_probs(rollout)
    (log_probs * rollout.response_mask).sum().backward()
    return {name: p.grad.clone() for name, p in policy.named_parameters() if p.requires_grad}


def test_transformers_and_peft_add_the_hook_that_the_policy_drops(make_policy):
    """The hook is there after transformers' and PEFT's set-up (what the policy removes is real), and gone from a
    checkpointed policy, with LoRA or without."""
    from peft import LoraConfig, get_peft_model

    from rlvr_lightning.policies.hf_loading import enable_gradient_checkpointing

    model = make_policy().model
    enable_gradient_checkpointing(model)
    assert input_grad_hooks(model) == ["make_inputs_require_grads"]
    wrapped = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    assert len(input_grad_hooks(wrapped)) == 2
    for options in ({}, {"lora": LoRAOptions(r=2)}):
        policy = make_policy(model=HFModelOptions(gradient_checkpointing=True), **options)
        assert policy.base_model.is_gradient_checkpointing and input_grad_hooks(policy.model) == []


@pytest.mark.parametrize("lora", [0, 2])
def test_checkpointed_gradients_equal_the_plain_ones(make_policy, lora):
    """Non-reentrant checkpointing reaches every trainable weight without the hook: the gradients of a checkpointed
    policy (LoRA's adapters or all weights) equal the uncheckpointed one's."""
    groups = {"lora": LoRAOptions(r=lora), "prompt": PromptOptions(template="raw")}
    plain = make_policy(**groups)
    checkpointed = make_policy(model=HFModelOptions(gradient_checkpointing=True), **groups)
    checkpointed.load_state_dict(plain.state_dict())
    torch.manual_seed(0)
    rollout = plain.sample(PROMPTS, 2, SamplingConfig(max_new_tokens=6))
    expected, got = scored_gradients(plain, rollout), scored_gradients(checkpointed, rollout)
    assert expected.keys() == got.keys() and expected
    reached = [name for name, grad in expected.items() if grad.abs().sum() > 0]  # LoRA's A: zero while B is zero
    assert len(reached) >= len(expected) // 2
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-6)


def test_a_checkpointed_policy_decodes_without_making_its_embeddings_require_grad(make_policy):
    """The decoding forwards of a checkpointed policy in train mode (as during fit) call no `requires_grad_` on the
    embeddings' output (torch 2.11's dynamo refused that call, so the compiled step fell back to a CUDA graph of the
    eager one on an H200), and the step compiled as one graph (`aot_eager`) samples the eager step's tokens."""
    from rlvr_lightning.generation import StaticCacheGeneration

    def sample(compile_mode: str, seen: list[bool] | None = None):
        policy = make_policy(
            model=HFModelOptions(gradient_checkpointing=True),
            generation=GenerationOptions(backend=StaticCacheGeneration(compile=compile_mode)),
            prompt=PromptOptions(template="raw"),
        )
        policy.train()
        if seen is not None:  # after the policy's own hooks: what the layers receive
            embeddings = policy.base_model.get_input_embeddings()
            embeddings.register_forward_hook(lambda module, args, output: seen.append(output.requires_grad))
        torch.manual_seed(3)
        return policy.sample(PROMPTS, 2, SamplingConfig(max_new_tokens=8, temperature=0.9))

    seen: list[bool] = []
    eager = sample("none", seen)
    assert seen and not any(seen)
    compiled = sample("aot_eager")
    assert torch.equal(compiled.response_ids, eager.response_ids)
    torch.testing.assert_close(compiled.sampling_log_probs, eager.sampling_log_probs, rtol=0, atol=1e-5)

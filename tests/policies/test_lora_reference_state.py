"""A LoRA policy's KL reference over an adapter loaded trained (an SFT stage's, a warm-up's) is the policy as it is
then, not the model before that stage; a state dict taken after the reference became an adapter copy loads into a
freshly built policy and reference (resuming, or `policy_from_checkpoint`), the copy and the marker's state
included."""

from __future__ import annotations

import torch
from torch import nn

from rlvr_lightning.modules.policy_checkpoint import policy_from_checkpoint
from rlvr_lightning.policies.hf_options import GenerationOptions, LoRAOptions
from rlvr_lightning.policies.lora_reference import AdapterReference
from tests.packed_rows import uneven_rollout


def lora_policy(make_policy):
    policy = make_policy(lora=LoRAOptions(r=2, alpha=4), generation=GenerationOptions(share_prompt_prefix=False))
    policy.eval()
    return policy


def move(policy, scale: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_" in name and ".default." in name:
                p.add_(scale * torch.randn(p.shape, generator=g))


def test_a_reference_over_a_trained_adapter_is_the_policy_as_it_is_then(make_policy):
    policy = lora_policy(make_policy)
    rollout = uneven_rollout(policy.hf_config.vocab_size)
    fresh = policy.create_reference()
    assert not fresh.has_adapter_copy  # a fresh adapter: disabling it is the policy itself
    move(policy, 0.5, seed=0)  # the warm start
    with torch.no_grad():
        start, _ = policy.token_log_probs(rollout)
        base = policy.reference_log_probs(fresh, rollout, 1.0)
    reference = policy.create_reference()
    assert isinstance(reference, AdapterReference) and reference.has_adapter_copy
    move(policy, 0.5, seed=1)  # training moves the policy, not the reference
    mask = rollout.response_mask.bool()
    torch.testing.assert_close(policy.reference_log_probs(reference, rollout, 1.0)[mask], start[mask])
    assert not torch.allclose(base[mask], start[mask], atol=1e-3)  # the model before the warm start differs


def test_a_state_dict_with_the_reference_adapter_loads_into_a_fresh_policy_and_reference(make_policy, tmp_path):
    policy = lora_policy(make_policy)
    rollout = uneven_rollout(policy.hf_config.vocab_size, seed=1)
    reference = policy.create_reference()
    move(policy, 0.5, seed=2)
    policy.update_reference(reference, alpha=1.0)  # a KL refresh: the reference becomes an adapter copy
    move(policy, 0.5, seed=3)
    saved = nn.ModuleDict({"policy": policy, "reference": reference}).state_dict()
    expected = policy.reference_log_probs(reference, rollout, 1.0)

    again = lora_policy(make_policy)
    restored = nn.ModuleDict({"policy": again, "reference": again.create_reference()})
    restored.load_state_dict(saved)  # strict: the reference adapter is added before the weights load
    assert restored["reference"].has_adapter_copy
    mask = rollout.response_mask.bool()
    torch.testing.assert_close(again.reference_log_probs(restored["reference"], rollout, 1.0)[mask], expected[mask])
    assert not any(p.requires_grad for name, p in again.named_parameters() if ".reference." in name)

    torch.save({"state_dict": {f"policy.{k}": v for k, v in policy.state_dict().items()}}, tmp_path / "run.ckpt")
    loaded = policy_from_checkpoint(lora_policy(make_policy), str(tmp_path / "run.ckpt"))  # the next stage's start
    with torch.no_grad():
        torch.testing.assert_close(loaded.token_log_probs(rollout)[0], policy.token_log_probs(rollout)[0])


def test_a_state_dict_from_before_the_marker_kept_its_state_still_loads(make_policy):
    policy = lora_policy(make_policy)
    holder = nn.ModuleDict({"policy": policy, "reference": policy.create_reference()})
    state = {k: v for k, v in holder.state_dict().items() if not k.endswith("adapter_copied")}
    holder.load_state_dict(state)  # strict
    assert not holder["reference"].has_adapter_copy

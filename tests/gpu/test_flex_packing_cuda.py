"""Packed scoring through FlexAttention on a CUDA device (`packed_attention: flex`, the default there): the compiled
kernel with a block mask of several 128-position tiles (skipped, full and partial ones) and grouped key/value heads
(9:3, as SmolLM2) gives the padded forward's log-probs and gradients, and scoring more micro-batches adds no host
synchronisation. The CPU versions are tests/policies/test_flex_packing.py and test_packed_host_syncs.py."""

from __future__ import annotations

import warnings

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (scripts/gpu_check.sh)")

PROMPTS = [40, 200, 7, 130, 9, 61]
RESPONSES = [300, 20, 150, 64, 1, 0]  # a row spanning several tiles, short rows sharing one, an empty response


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config
    from rlvr_lightning.policies.hf import HFPolicy
    from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions
    from rlvr_lightning.runtime.devices import set_compute_device

    tokenizer = str(save_tiny_tokenizer(tmp_path_factory.mktemp("tok")))
    heads = dict(hidden_size=144, num_attention_heads=9, num_key_value_heads=3)  # heads 16 wide: the kernel's least
    config = tiny_llama_config(**heads, max_position_embeddings=1024)
    torch.manual_seed(0)
    policy = HFPolicy(
        model=HFModelOptions(config=config, tokenizer=tokenizer, compile_layers="none"),  # compiled: its own test
        generation=GenerationOptions(share_prompt_prefix=False),
    ).cuda()
    set_compute_device(policy, torch.device("cuda"))
    assert policy.packed_attention == "auto"
    assert policy.packed_attention_kernel(torch.device("cuda")) == "rlvr_packed_flex"
    return policy


def _rollout(policy, prompts=PROMPTS, responses=RESPONSES, seed=0):
    from tests.packed_rows import uneven_rollout

    rollout = uneven_rollout(policy.hf_config.vocab_size, seed, prompts, responses)
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "group_index", "truncated"):
        setattr(rollout, name, getattr(rollout, name).cuda())
    return rollout


def _scores(policy, rollout, packed: bool, dtype: torch.dtype):
    policy.packed_sequences = packed
    policy.model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        log_probs, _ = policy.token_log_probs(rollout, 0.8)
    (log_probs.sum() / rollout.response_mask.sum()).backward()
    _assert_flex_ran(policy)
    return log_probs.detach().float(), [p.grad.float() for p in policy.model.parameters() if p.grad is not None]


def _assert_flex_ran(policy):
    """`auto` falls back to the model's kernel (with a warning) where FlexAttention fails to compile: that would
    leave these tests comparing the model's kernel with itself."""
    assert policy.packed_attention_kernel(torch.device("cuda")) == "rlvr_packed_flex", "FlexAttention fell back"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flex_scores_and_gradients_equal_the_padded_ones(policy, dtype):
    rollout = _rollout(policy)
    flex_values, flex_grads = _scores(policy, rollout, True, dtype)
    padded_values, padded_grads = _scores(policy, rollout, False, dtype)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(flex_values, padded_values, atol=tol, rtol=0)
    for a, b in zip(flex_grads, padded_grads, strict=True):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)


def test_more_micro_batches_add_no_host_synchronisation(policy):
    """`torch.cuda.set_sync_debug_mode` warns at every synchronising call: 6 micro-batches of a mini-batch
    synchronise as often as 3 (the rows' lengths are read once per mini-batch)."""
    from rlvr_lightning.modules.options import UpdateConfig
    from rlvr_lightning.modules.update.micro_batches import micro_batches

    def syncs(num_rows: int) -> tuple[int, int]:
        rollout = _rollout(policy, [30 + 7 * i for i in range(num_rows)], [40 + 5 * i for i in range(num_rows)], 1)
        budget = UpdateConfig(micro_batch_tokens=2 * (30 + 7 * (num_rows - 1) + 40 + 5 * (num_rows - 1)))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode(1)
            try:
                micros = list(micro_batches(rollout, budget))
                for micro in micros:
                    log_probs, _ = policy.token_log_probs(micro, 0.8)
                    log_probs.sum().backward()
            finally:
                torch.cuda.set_sync_debug_mode(0)
        return len(micros), sum("called a synchronizing CUDA operation" in str(w.message) for w in caught)

    policy.packed_sequences = True
    syncs(6), syncs(12)  # compiles for these shapes
    (few, few_syncs), (many, many_syncs) = syncs(6), syncs(12)
    _assert_flex_ran(policy)
    assert many > few, (few, many)
    assert 0 < many_syncs <= few_syncs, (few, few_syncs, many, many_syncs)  # the lengths' read is counted

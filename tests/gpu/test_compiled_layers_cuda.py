"""Scoring through inductor-compiled decoder layers on a CUDA device (`model.compile_layers: default`): padded and
packed through FlexAttention (compiled inside the layers' graph), in fp32 and under bf16 autocast, the log-probs and
gradients of the layers as written. The CPU version (`aot_eager`) is tests/policies/test_compiled_layers.py."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (scripts/gpu_check.sh)")


def _policy(tokenizer: str, compile_layers: str):
    from rlvr_lightning.demos.tiny_lm import tiny_llama_config
    from rlvr_lightning.policies.hf import HFPolicy
    from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions
    from rlvr_lightning.runtime.devices import set_compute_device

    # 9:3 heads as SmolLM2's, 16 wide: the narrowest FlexAttention's CUDA kernel takes
    config = tiny_llama_config(hidden_size=144, num_attention_heads=9, num_key_value_heads=3, num_hidden_layers=3)
    torch.manual_seed(0)
    policy = HFPolicy(
        model=HFModelOptions(config=config, tokenizer=tokenizer, compile_layers=compile_layers),
        generation=GenerationOptions(share_prompt_prefix=False),
    ).cuda()
    set_compute_device(policy, torch.device("cuda"))
    return policy


@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer

    tokenizer = str(save_tiny_tokenizer(tmp_path_factory.mktemp("tok")))
    return _policy(tokenizer, "none"), _policy(tokenizer, "default")


def _scores(policy, packed: bool, dtype: torch.dtype):
    from tests.packed_rows import uneven_rollout

    rollout = uneven_rollout(policy.hf_config.vocab_size, 0, [40, 200, 7, 130], [300, 20, 150, 1])
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "group_index", "truncated"):
        setattr(rollout, name, getattr(rollout, name).cuda())
    policy.packed_sequences = packed
    policy.model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        log_probs, _ = policy.token_log_probs(rollout, 0.8)
    (log_probs.sum() / rollout.response_mask.sum()).backward()
    grads = {n: p.grad.float() for n, p in policy.model.named_parameters() if p.grad is not None}
    if packed:  # not the model's kernel after a failed compile (`auto` falls back with a warning)
        assert policy.packed_attention_kernel(torch.device("cuda")) == "rlvr_packed_flex"
    return log_probs.detach().float(), grads


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_layers_score_as_the_layers_as_written(policies, packed, dtype):
    (eager, eager_grads), (compiled, compiled_grads) = (_scores(p, packed, dtype) for p in policies)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(compiled, eager, atol=tol, rtol=0)
    assert compiled_grads.keys() == eager_grads.keys()
    for name, grad in eager_grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, atol=tol, rtol=tol)

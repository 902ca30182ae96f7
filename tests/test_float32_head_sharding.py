"""`model.lm_head_fp32` under FSDP2 (one process over gloo, as tests/test_sharding.py): an untied float32 head is a
unit of its own, gathered in float32 whatever `param_dtype` says, so its log-probs are the float32 head's; a tied
head stays in the root unit with the embeddings."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.fsdp import FSDPModule

from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config
from rlvr_lightning.parallel import ShardingOptions
from rlvr_lightning.parallel.fsdp import shard_policy
from rlvr_lightning.policies.hf_options import HFModelOptions

from .policies.test_lm_head_fp32 import _by_hand, _rollout
from .test_sharding import one_process_group  # noqa: F401 (a fixture)


def _sharded_policy(tmp_path, dtype: str, tied: bool):
    from torch.distributed.device_mesh import init_device_mesh

    from rlvr_lightning.policies.hf import HFPolicy

    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    torch.manual_seed(0)
    config = tiny_llama_config(tie_word_embeddings=tied)
    model = HFModelOptions(config=config, tokenizer=str(save_tiny_tokenizer(tmp_path)), dtype=dtype, lm_head_fp32=True)
    policy = HFPolicy(model=model)
    weight = policy.base_model.get_output_embeddings().weight.detach().float().clone()
    options = ShardingOptions(param_dtype="bfloat16")
    shard_policy(policy, init_device_mesh("cpu", (1,)), options, root_reshard_after_forward=False)
    return policy, weight


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_untied_float32_head_is_gathered_in_float32(tmp_path, one_process_group, dtype):  # noqa: F811
    policy, weight = _sharded_policy(tmp_path, dtype, tied=False)
    head = policy.base_model.get_output_embeddings()
    assert isinstance(head, FSDPModule) and head is not policy.model
    rollout = _rollout(policy)
    log_probs, _, hidden = policy.token_log_probs_and_hidden(rollout)
    logits = torch.nn.functional.linear(hidden.detach().float(), weight)
    expected = logits.log_softmax(-1).gather(-1, rollout.response_ids.unsqueeze(-1)).squeeze(-1)
    mask = rollout.response_mask > 0
    assert (log_probs.detach() - expected)[mask].abs().max() <= 1e-6  # bf16-gathered weights: ~1e-3
    (log_probs * rollout.response_mask).sum().backward()
    assert head.weight.grad is not None and head.weight.grad.dtype == torch.float32


def test_a_tied_float32_head_stays_in_the_root_unit(tmp_path, one_process_group):  # noqa: F811
    policy, _ = _sharded_policy(tmp_path, "float32", tied=True)
    head = policy.base_model.get_output_embeddings()
    assert not isinstance(head, FSDPModule) and head.weight is policy.base_model.get_input_embeddings().weight
    rollout = _rollout(policy)
    log_probs, _, hidden = policy.token_log_probs_and_hidden(rollout)
    assert log_probs.dtype == torch.float32 and torch.isfinite(log_probs).all()
    # the shared weight gathered in bf16, upcast for the head's GEMM
    expected = _by_hand(policy, hidden.detach(), rollout.response_ids)
    mask = rollout.response_mask > 0
    assert policy.base_model.get_output_embeddings().weight.dtype == torch.bfloat16
    torch.testing.assert_close(log_probs.detach()[mask], expected[mask], atol=1e-6, rtol=0)

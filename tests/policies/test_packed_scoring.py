"""Padding-free packed scoring (`HFPolicy.packed_sequences`) gives the padded forward's numbers: log-probs, entropy,
hidden states and their gradients, on rows of very uneven lengths (left-padded prompts, a hole in a response mask,
an empty response), with transformers' own packed-sequence mask and with the explicit block-diagonal one."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.core.packing import block_causal_mask, packed_layout, partition_by_tokens
from rlvr_lightning.policies import packing
from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions, LoRAOptions
from tests.packed_rows import PROMPT_LENGTHS, RESPONSE_LENGTHS, uneven_rollout


def _scores(policy, rollout, packed: bool):
    policy.packed_sequences = packed
    policy.model.zero_grad()
    log_probs, entropy, hidden = policy.token_log_probs_and_hidden(rollout, 0.7, with_entropy=True)
    tokens = rollout.response_mask.sum()
    ((log_probs.sum() + 0.1 * entropy.sum()) / tokens + hidden.square().sum() / tokens).backward()
    grads = [p.grad.clone() for p in policy.model.parameters() if p.grad is not None]
    with torch.no_grad():
        decoder_hidden = policy.response_hidden_states(rollout)
    return log_probs.detach(), entropy.detach(), hidden.detach(), decoder_hidden, grads


def _assert_same(a, b, tol=1e-5):
    for x, y in zip(a[:4], b[:4], strict=True):
        assert x.shape == y.shape
        torch.testing.assert_close(x, y, atol=tol, rtol=0)
    for x, y in zip(a[4], b[4], strict=True):
        torch.testing.assert_close(x, y, atol=tol, rtol=0)


@pytest.mark.parametrize("share_prompt_prefix", [False, True])
def test_packed_scoring_matches_padded(make_policy, share_prompt_prefix):
    policy = make_policy(generation=GenerationOptions(share_prompt_prefix=share_prompt_prefix))
    rollout = uneven_rollout(policy.hf_config.vocab_size)
    calls = []
    handle = policy.model.register_forward_pre_hook(
        lambda m, a, k: calls.append(k["input_ids"].shape), with_kwargs=True
    )
    try:
        packed = _scores(policy, rollout, packed=True)
    finally:
        handle.remove()
    assert calls[0][0] == 1  # one packed row
    assert calls[0][1] == sum(PROMPT_LENGTHS) + sum(max(r - 1, 0) for r in RESPONSE_LENGTHS)
    _assert_same(packed, _scores(policy, rollout, packed=False))
    assert bool((packed[0][3] == 0).all())  # the empty response


@pytest.mark.parametrize(
    "options", [{"lora": LoRAOptions(r=4, alpha=8.0)}, {"model": HFModelOptions(gradient_checkpointing=True)}]
)
def test_packed_scoring_matches_padded_with_lora_or_checkpointing(make_policy, options):
    policy = make_policy(generation=GenerationOptions(share_prompt_prefix=False), **options)
    policy.train()
    rollout = uneven_rollout(policy.hf_config.vocab_size, seed=2)
    _assert_same(_scores(policy, rollout, packed=True), _scores(policy, rollout, packed=False))


def test_explicit_block_mask_matches_padded(make_policy, monkeypatch):
    """A model whose mask is not built by transformers' masking utilities gets the explicit block-diagonal mask."""
    policy = make_policy(generation=GenerationOptions(share_prompt_prefix=False))
    rollout = uneven_rollout(policy.hf_config.vocab_size, seed=1)
    padded = _scores(policy, rollout, packed=False)
    monkeypatch.setattr(packing, "builds_packed_mask", lambda model: False)
    _assert_same(_scores(policy, rollout, packed=True), padded)


def test_packing_gives_way_to_prefix_sharing_when_that_runs_fewer_positions(make_policy):
    """Eight rows sharing one long prompt with short responses: prefix sharing (the prompt once) is cheaper."""
    policy = make_policy(generation=GenerationOptions(share_prompt_prefix=True))
    shared = uneven_rollout(policy.hf_config.vocab_size, prompt_lengths=[9] * 8, response_lengths=[2, 3] * 4)
    shared.prompt_ids[:] = shared.prompt_ids[0]
    policy.packed_sequences = True
    assert not policy._packing_pays(shared)
    assert policy._packing_pays(uneven_rollout(policy.hf_config.vocab_size))  # distinct prompts: packed
    policy.share_prompt_prefix = False
    assert policy._packing_pays(shared)


def test_packed_layout_by_hand():
    # rows: prompt 2 + response 3 -> positions p p r r ; prompt 1 + response 2 -> p r ; prompt 2 + response 0 -> p p
    layout = packed_layout(torch.tensor([2, 1, 2]), torch.tensor([3, 2, 0]))
    assert layout.position_ids.tolist() == [0, 1, 2, 3, 0, 1, 0, 1]
    assert layout.score_index.tolist() == [1, 2, 3, 4, 5]
    assert layout.score_rows.tolist() == [0, 0, 0, 1, 1]
    assert layout.score_columns.tolist() == [0, 1, 2, 0, 1]
    assert layout.cu_seqlens.tolist() == [0, 4, 6, 8]
    assert layout.max_length == 4
    allowed = block_causal_mask(layout.position_ids, torch.float32)[0, 0] == 0
    assert allowed[5].tolist() == [False] * 4 + [True, True, False, False]
    assert allowed[3].tolist() == [True] * 4 + [False] * 4


def test_partition_by_tokens():
    lengths = [7, 3, 5, 2, 6, 1]
    parts = partition_by_tokens(lengths, budget=8)
    assert sorted(i for part in parts for i in part) == list(range(6))
    assert all(sum(lengths[i] for i in part) <= 8 for part in parts)
    assert len(parts) == 3  # 24 tokens, at least 3 parts of 8
    more = partition_by_tokens(lengths, budget=8, num_parts=5)
    assert len(more) == 5 and all(part and sum(lengths[i] for i in part) <= 8 for part in more)
    with pytest.raises(ValueError, match="does not fit"):
        partition_by_tokens(lengths, budget=6)


def _gpu_implementations() -> list[str]:
    from transformers.utils import is_flash_attn_2_available

    return ["sdpa", "eager"] + (["flash_attention_2"] if is_flash_attn_2_available() else [])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("implementation", _gpu_implementations())
def test_packed_scoring_matches_padded_on_a_gpu(make_policy, implementation):
    """On a GPU with the model's own kernel (fp32; flash attention in bf16 where installed, which only the packed path
    can use unpadded); FlexAttention's: tests/gpu/test_flex_packing_cuda.py."""
    from rlvr_lightning.runtime.devices import set_compute_device

    dtype = torch.bfloat16 if implementation == "flash_attention_2" else torch.float32
    policy = make_policy(
        generation=GenerationOptions(share_prompt_prefix=False),
        model=HFModelOptions(attn_implementation=implementation, packed_attention="model"),
    )
    policy.to(device="cuda", dtype=dtype)
    set_compute_device(policy, torch.device("cuda"))
    rollout = uneven_rollout(policy.hf_config.vocab_size)
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "group_index", "truncated"):
        setattr(rollout, name, getattr(rollout, name).cuda())
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-4
    packed = [t.cpu().float() for t in _scores(policy, rollout, packed=True)[:4]]
    padded = [t.cpu().float() for t in _scores(policy, rollout, packed=False)[:4]]
    for a, b in zip(packed, padded, strict=True):
        torch.testing.assert_close(a, b, atol=tol, rtol=0)


def test_more_parts_than_the_fewest_always_fit(monkeypatch):
    """Where greedy with the asked-for count would overflow a group, the fitting partition is split instead."""
    from rlvr_lightning.core import packing as core_packing

    greedy = core_packing.balanced_partition
    overflowing = lambda lengths, num_parts: [list(range(len(lengths)))] + [[]] * (num_parts - 1)  # noqa: E731
    monkeypatch.setattr(
        core_packing, "balanced_partition", lambda lengths, k: overflowing(lengths, k) if k == 5 else greedy(lengths, k)
    )
    lengths = [7, 3, 5, 2, 6, 1]
    parts = core_packing.partition_by_tokens(lengths, budget=8, num_parts=5)
    assert len(parts) == 5 and sorted(i for part in parts for i in part) == list(range(6))
    assert all(part and sum(lengths[i] for i in part) <= 8 for part in parts)

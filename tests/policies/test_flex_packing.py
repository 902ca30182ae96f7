"""Packed scoring through FlexAttention (`model.packed_attention: flex`, `policies/flex_packing.py`) gives the
padded forward's log-probs and parameter gradients, grouped key/value heads included; tiles small enough here that
the block mask has skipped, full and partial tiles (on a CPU the tiles are expanded into a mask: the reference of
what the GPU kernel computes); with the model and the rows on another device than the CPU, nothing around the kernel
combines a tensor left on the CPU with them."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.demos.tiny_lm import tiny_llama_config
from rlvr_lightning.policies import flex_packing
from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions
from tests.emulated_device import DEVICE, emulated_device, move_onto_emulated_device
from tests.packed_rows import uneven_rollout


def _log_probs_and_grads(policy, rollout, packed: bool):
    policy.packed_sequences = packed
    policy.model.zero_grad()
    log_probs, _ = policy.token_log_probs(rollout, 0.7)
    (log_probs.sum() / rollout.response_mask.sum()).backward()
    return log_probs.detach(), [p.grad.clone() for p in policy.model.parameters() if p.grad is not None]


@pytest.fixture
def counted_flex(monkeypatch):
    calls = []
    kernel = flex_packing.packed_flex_attention

    def counting(module, query, key, value, attention_mask, **kwargs):
        calls.append((query.shape[1], key.shape[1]))
        return kernel(module, query, key, value, attention_mask, **kwargs)

    monkeypatch.setattr(flex_packing, "packed_flex_attention", counting)
    flex_packing.register_flex_attention.cache_clear()
    yield calls
    flex_packing.register_flex_attention.cache_clear()
    flex_packing.register_flex_attention()  # the real function again


@pytest.mark.parametrize(
    "heads",
    [
        {"num_attention_heads": 4, "num_key_value_heads": 4},
        {"num_attention_heads": 4, "num_key_value_heads": 2},
        {"hidden_size": 72, "num_attention_heads": 9, "num_key_value_heads": 3},  # SmolLM2's 9:3, not a power of 2
    ],
)
@pytest.mark.parametrize("block_size", [8, 128])
def test_flex_packed_scoring_matches_padded(make_policy, monkeypatch, counted_flex, heads, block_size):
    monkeypatch.setattr(flex_packing, "BLOCK_SIZE", block_size)
    policy = make_policy(
        model=HFModelOptions(config=tiny_llama_config(**heads), packed_attention="flex"),
        generation=GenerationOptions(share_prompt_prefix=False),
    )
    rollout = uneven_rollout(policy.hf_config.vocab_size, seed=3)
    flex_values, flex_grads = _log_probs_and_grads(policy, rollout, packed=True)
    layers = policy.hf_config.num_hidden_layers
    query_heads, kv_heads = heads["num_attention_heads"], heads["num_key_value_heads"]
    assert counted_flex == [(query_heads, kv_heads)] * layers  # FlexAttention ran, K/V heads not repeated
    assert policy.hf_config._attn_implementation == "sdpa"  # switched back after the forward
    padded_values, padded_grads = _log_probs_and_grads(policy, rollout, packed=False)
    assert len(counted_flex) == layers
    torch.testing.assert_close(flex_values, padded_values, atol=1e-5, rtol=0)
    assert len(flex_grads) == len(padded_grads)
    for a, b in zip(flex_grads, padded_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_the_kernel_follows_the_option(make_policy):
    policy = make_policy(model=HFModelOptions(packed_attention="auto"))
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert policy.packed_attention_kernel(cpu) == "sdpa"  # today's path on a CPU
    assert policy.packed_attention_kernel(cuda) == flex_packing.FLEX_IMPLEMENTATION
    policy.packed_attention = "model"
    assert policy.packed_attention_kernel(cuda) == "sdpa"
    policy.packed_attention = "auto"
    policy.hf_config._attn_implementation = "flash_attention_2"  # its varlen kernel needs no mask either
    assert policy.packed_attention_kernel(cuda) == "flash_attention_2"
    policy.hf_config._attn_implementation = "sdpa"
    policy.packed_attention, policy.gradient_checkpointing = "auto", True
    assert policy.packed_attention_kernel(cuda) == "sdpa"  # the backward's recomputation would not see flex
    policy.packed_attention = "flex"
    with pytest.raises(ValueError, match="packed_attention='flex': gradient checkpointing is on; valid here"):
        policy.packed_attention_kernel(cpu)
    other = make_policy(model=HFModelOptions(packed_attention="auto"))
    other.base_model.gradient_checkpointing_enable()  # turned on outside the policy's own option
    assert other.packed_attention_kernel(cuda) == "sdpa"


def test_heads_narrower_than_16_keep_the_model_kernel_on_cuda(make_policy):
    """Inductor's FlexAttention kernel refuses a head size under 16 on CUDA (`tl.dot`): `auto` keeps the model's
    kernel there without a failed compile, `flex` says why; on a CPU the head size does not matter."""
    narrow = tiny_llama_config(hidden_size=72, num_attention_heads=9, num_key_value_heads=3)  # head size 8
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    policy = make_policy(model=HFModelOptions(config=narrow, packed_attention="auto"))
    assert policy.packed_attention_kernel(cuda) == "sdpa"
    policy.packed_attention = "flex"
    assert policy.packed_attention_kernel(cpu) == flex_packing.FLEX_IMPLEMENTATION
    with pytest.raises(ValueError, match="packed_attention='flex': .* head size of at least 16, and the model's is 8"):
        policy.packed_attention_kernel(cuda)
    wide = make_policy(model=HFModelOptions(config=tiny_llama_config(num_attention_heads=4), packed_attention="auto"))
    assert wide.packed_attention_kernel(cuda) == flex_packing.FLEX_IMPLEMENTATION  # head size 16


def test_a_bad_value_names_the_option_and_the_choices(make_policy, monkeypatch):
    loaded = []
    monkeypatch.setattr("rlvr_lightning.policies.hf_loading.model_from_config", lambda *a: loaded.append(a))
    with pytest.raises(
        ValueError, match=r"model.packed_attention='flash' is not valid; choose one of \['auto', 'flex', 'model'\]"
    ):
        make_policy(model=HFModelOptions(packed_attention="flash"))
    assert not loaded  # before any model is built


def test_torch_flex_attention_reads_the_block_mask_as_the_reference_does():
    """torch's own (eager) FlexAttention with our block mask gives the reference's values (forward only: it has no
    CPU backward)."""
    from torch.nn.attention.flex_attention import flex_attention

    doc = torch.repeat_interleave(torch.arange(4), torch.tensor([7, 2, 11, 5]))
    block_mask = flex_packing.document_block_mask(doc, block_size=128)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, doc.numel(), 8, generator=g) for h in (4, 2, 2))
    with torch.no_grad():
        expected = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, flex_packing.expanded_block_mask(block_mask), enable_gqa=True
        )
        torch.testing.assert_close(flex_attention(q, k, v, block_mask=block_mask, enable_gqa=True), expected)
    index = torch.arange(doc.numel())
    dense = (doc[:, None] == doc[None, :]) & (index[None, :] <= index[:, None])
    assert torch.equal(flex_packing.expanded_block_mask(flex_packing.document_block_mask(doc, 4)), dense)


def test_auto_scores_with_the_models_kernel_after_flex_failed_to_compile(make_policy, monkeypatch, counted_flex):
    """`packed_attention: auto` whose FlexAttention fails to compile warns, gives the model kernel's log-probs and
    gradients for that forward and does not try again; `flex` named in the config raises the compiler's error."""
    from rlvr_lightning.policies import hf_scoring

    class CompileFailure(torch._dynamo.exc.TorchDynamoException):  # what dynamo and inductor raise derive from it
        pass

    def compile_failure(*args, **kwargs):
        raise CompileFailure("no working Triton here")

    monkeypatch.setattr(hf_scoring, "use_flex", lambda choice, *args: choice != "model")  # as on a CUDA device
    monkeypatch.setattr(flex_packing, "expanded_block_mask", compile_failure)
    kwargs = {"generation": GenerationOptions(share_prompt_prefix=False)}
    policy = make_policy(model=HFModelOptions(packed_attention="auto"), **kwargs)
    rollout = uneven_rollout(policy.hf_config.vocab_size, seed=3)
    with pytest.warns(UserWarning, match="compiling FlexAttention for packed scoring failed.*no working Triton"):
        values, grads = _log_probs_and_grads(policy, rollout, packed=True)
    assert len(counted_flex) == 1  # the first layer's attempt
    reference = make_policy(model=HFModelOptions(packed_attention="model"), **kwargs)
    expected, expected_grads = _log_probs_and_grads(reference, rollout, packed=True)
    torch.testing.assert_close(values, expected, atol=0, rtol=0)
    for a, b in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    _log_probs_and_grads(policy, rollout, packed=True)
    assert len(counted_flex) == 1 and policy.packed_attention_kernel(rollout.prompt_ids.device) == "sdpa"
    named = make_policy(model=HFModelOptions(packed_attention="flex"), **kwargs)
    with pytest.raises(CompileFailure, match="no working Triton here"):
        _log_probs_and_grads(named, rollout, packed=True)


def test_the_compiled_kernel_builds_its_backward_with_its_forward(monkeypatch):
    """A FlexAttention backward that cannot build on the machine fails inside the forward (where `auto` falls back to
    the model's kernel), not at the first `loss.backward()`: AOTAutograd lowers the backward eagerly in the call."""
    from torch._functorch import config as functorch_config

    from rlvr_lightning.policies import flex_packing

    seen = []
    monkeypatch.setattr(
        torch, "compile", lambda fn: lambda *a, **k: seen.append(functorch_config.force_non_lazy_backward_lowering)
    )
    flex_packing._compiled_flex_attention.cache_clear()
    try:
        flex_packing._compiled_flex_attention()(None)
    finally:
        flex_packing._compiled_flex_attention.cache_clear()
    assert seen == [True] and functorch_config.force_non_lazy_backward_lowering is False


def packed_scoring_elsewhere(policy) -> list[str]:
    """Forward and backward of packed micro-batches with the model and the rows on another device than the CPU
    (`tests/emulated_device.py`; the attention is the CPU's reference there, not the compiled kernel): the operators
    that combined a tensor left on the CPU with them."""
    from rlvr_lightning.modules.options import UpdateConfig
    from rlvr_lightning.modules.update.micro_batches import micro_batches

    policy.packed_sequences = True
    with emulated_device() as device:
        move_onto_emulated_device(policy.model)
        rollout = uneven_rollout(policy.hf_config.vocab_size).to(DEVICE)
        micros = list(micro_batches(rollout, UpdateConfig(micro_batch_tokens=24)))
        for micro in micros:
            log_probs, entropy = policy.token_log_probs(micro, 0.7, with_entropy=True, entropy_grad=False)
            (log_probs.sum() + entropy.sum()).backward()
            assert log_probs.device == DEVICE and next(policy.model.parameters()).grad.device == DEVICE
    assert len(micros) >= 3
    return device.mixed


@pytest.mark.parametrize("shape", [{}, {"hidden_size": 72, "num_attention_heads": 9, "num_key_value_heads": 3}])
def test_packed_flex_scoring_leaves_no_tensor_on_the_cpu(make_policy, shape):
    """The block mask, the layout moved in one copy, the LM head's chunked backward (with its GPU chunk size): every
    tensor they combine on the model's device."""
    policy = make_policy(model=HFModelOptions(config=tiny_llama_config(**shape), packed_attention="flex"))
    assert packed_scoring_elsewhere(policy) == []


def test_a_tensor_left_on_the_cpu_is_found(make_policy, monkeypatch):
    """A block mask whose tile counts are made without naming a device."""
    from rlvr_lightning.core import packing

    listed = packing._listed

    def counts_made_on_the_cpu(tiles):
        counts, order = listed(tiles)
        return torch.zeros(counts.shape, dtype=counts.dtype) + counts, order

    monkeypatch.setattr(packing, "_listed", counts_made_on_the_cpu)
    mixed = packed_scoring_elsewhere(make_policy(model=HFModelOptions(packed_attention="flex")))
    assert mixed and all("packing.py" in line for line in mixed), mixed

"""Lean RMSNorm and SwiGLU layers (`policies/lean_layers.py`): the forward is bitwise transformers' own, the
gradients equal to float rounding, and fewer bytes are kept for the backward pass."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from rlvr_lightning.policies import lean_layers
from rlvr_lightning.policies.hf_options import HFModelOptions
from rlvr_lightning.policies.lean_layers import RMSNormFunction, SiluMulFunction, apply_lean_layers


def _model(config_class):
    torch.manual_seed(0)
    config = config_class(
        vocab_size=97, hidden_size=32, intermediate_size=88, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager").float()


def _saved_bytes(model, ids) -> tuple[int, torch.Tensor]:
    storages = {}

    def pack(tensor):
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(input_ids=ids).logits.float().log_softmax(-1).mean()
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(size for pointer, size in storages.items() if pointer not in parameters), loss


@pytest.mark.parametrize("config_class", [LlamaConfig, Qwen2Config])
def test_same_forward_gradients_to_rounding_and_fewer_saved_bytes(config_class):
    plain, lean = _model(config_class), _model(config_class)
    assert apply_lean_layers(lean) == 2 * 2 + 1 + 2  # 2 norms and 1 MLP per layer, the final norm
    ids = torch.randint(0, 97, (3, 11))
    plain_bytes, plain_loss = _saved_bytes(plain, ids)
    lean_bytes, lean_loss = _saved_bytes(lean, ids)
    assert torch.equal(plain_loss, lean_loss)
    plain_loss.backward()
    lean_loss.backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), lean.named_parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-7, rtol=1e-5, msg=name)
    # per token and layer: one hidden-size vector per norm (2) and one intermediate-size vector (the MLP)
    tokens, layers = ids.numel(), 2
    expected = 4 * tokens * (layers * (2 * 32 + 88) + 32)  # and the final norm's
    assert plain_bytes - lean_bytes == expected
    with torch.no_grad():
        assert torch.equal(plain(input_ids=ids).logits, lean(input_ids=ids).logits)


def test_the_fused_norm_of_a_cuda_device_scores_and_trains_as_the_plain_model(monkeypatch):
    """`F.rms_norm`, which a CUDA device runs as one fused kernel each way: here its CPU decomposition (the same
    formula); tests/gpu/test_lean_cuda.py compares the fused kernel itself with the plain model."""
    assert not lean_layers.fused_norm_applies(torch.ones(2), torch.ones(2))  # a CPU tensor
    calls = []
    monkeypatch.setattr(lean_layers, "fused_norm_applies", lambda x, weight: calls.append(x.shape) or True)
    plain, lean = _model(LlamaConfig), _model(LlamaConfig)
    apply_lean_layers(lean)
    ids = torch.randint(0, 97, (3, 11))
    losses = [model(input_ids=ids).logits.log_softmax(-1).mean() for model in (plain, lean)]
    assert len(calls) == 2 * 2 + 1  # every norm took the fused path
    torch.testing.assert_close(losses[1], losses[0], atol=1e-6, rtol=0)
    for loss in losses:
        loss.backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), lean.named_parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-6, rtol=1e-4, msg=name)


def test_the_functions_gradients_against_finite_differences():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, w: RMSNormFunction.apply(a, w, 1e-6), (x, weight))
    gate, up = torch.randn(4, 6, dtype=torch.float64, requires_grad=True), torch.randn(4, 6, dtype=torch.float64)
    up.requires_grad_(True)
    assert torch.autograd.gradcheck(SiluMulFunction.apply, (gate, up))


def test_a_lean_model_deep_copies_and_pickles_with_its_lean_layers():
    lean = _model(LlamaConfig)
    apply_lean_layers(lean)
    ids = torch.randint(0, 97, (2, 5))
    for other in (copy.deepcopy(lean), pickle.loads(pickle.dumps(lean))):
        norm = other.model.norm
        assert norm.forward.args[0] is norm  # bound to the copy, not to the original
        assert torch.equal(other(input_ids=ids).logits, lean(input_ids=ids).logits)


def test_other_layers_are_left_as_they_are():
    class GeluMLP(torch.nn.Module):
        pass

    model = torch.nn.Sequential(torch.nn.LayerNorm(4), GeluMLP())
    assert apply_lean_layers(model) == 0


@pytest.mark.parametrize("packed", [False, True])
def test_a_lean_policy_scores_as_the_plain_one(make_policy, packed):
    """`HFPolicy(lean_activations=True)`: the lean layers and the output layer through `linear_token_log_probs`
    (prefix-shared and packed scoring) give the plain policy's log-probs, entropies and gradients."""
    from rlvr_lightning.policies import SamplingConfig

    plain, lean = (
        make_policy(model=HFModelOptions(lean_activations=False)),
        make_policy(model=HFModelOptions(lean_activations=True)),
    )
    assert lean._output_layer(entropy_gradient=False) is not None and plain._output_layer(False) is None
    torch.manual_seed(0)
    rollout = plain.sample({"prompt": ["ab", "ba c"]}, n=3, sampling=SamplingConfig(max_new_tokens=6))
    results = []
    for policy in (plain, lean):
        policy.packed_sequences = packed
        log_probs, entropy = policy.token_log_probs(rollout, temperature=0.9, with_entropy=True, entropy_grad=False)
        (log_probs * rollout.response_mask).sum().backward()
        results.append((log_probs.detach(), entropy, [p.grad for p in policy.parameters()]))
    (plain_lp, plain_entropy, plain_grads), (lean_lp, lean_entropy, lean_grads) = results
    # the output layer runs on other shapes (one [N * T, H] product, not the model's), so equal to rounding
    torch.testing.assert_close(lean_lp, plain_lp, atol=1e-6, rtol=0)
    torch.testing.assert_close(lean_entropy, plain_entropy, atol=1e-6, rtol=0)
    # a weight's gradient sums every scored token's product in another order: float32 rounding of sums of ~1e-2
    # terms reaches ~1e-6 (seen 1.13e-6 on an AMD EPYC with AVX2)
    for a, b in zip(plain_grads, lean_grads, strict=True):
        torch.testing.assert_close(b, a, atol=5e-6, rtol=1e-5)

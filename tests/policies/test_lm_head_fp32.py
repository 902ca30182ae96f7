"""`model.lm_head_fp32` (`core/float32_head.py`): every logit of the policy (scoring, lean or not, its gradients,
the sampling loops, eager and static, and the bf16 sampling copy) comes from a float32 GEMM of float32 hidden states
and a float32 weight under bf16 autocast or bf16 weights; an untied head is stored in float32, a tied one keeps the
shared weight; a LoRA adapter on the head is refused."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from rlvr_lightning.core.float32_head import Float32Head
from rlvr_lightning.core.log_probs import linear_token_log_probs, token_log_probs_from_logits
from rlvr_lightning.demos.tiny_lm import tiny_llama_config
from rlvr_lightning.generation import KVCacheGeneration, StaticCacheGeneration
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions, LoRAOptions, PromptOptions
from rlvr_lightning.rollout import Rollout

PROMPTS = {"prompt": ["What is 2+3?", "The quick brown fox", "Say ab."]}
BF16 = torch.bfloat16


def autocast():
    return torch.autocast("cpu", dtype=BF16)


def _policy(make_policy, fp32: bool, dtype: str = "float32", tied: bool = False, lean: bool = True, **groups):
    model = HFModelOptions(
        config=tiny_llama_config(tie_word_embeddings=tied), dtype=dtype, lm_head_fp32=fp32, lean_activations=lean
    )
    return make_policy(model=model, prompt=PromptOptions(template="raw"), **groups)


def _rollout(policy) -> Rollout:
    """Three rows, each prompt twice (prefix sharing on a CPU), responses of uneven lengths."""
    torch.manual_seed(3)
    prompt_ids = torch.randint(10, 300, (3, 5)).repeat_interleave(2, dim=0)
    response_ids = torch.randint(10, 300, (6, 7))
    response_mask = torch.ones(6, 7)
    response_mask[1, 5:] = 0
    response_mask[4, 3:] = 0
    return Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=torch.ones_like(prompt_ids),
        response_ids=response_ids,
        response_mask=response_mask,
        group_index=torch.arange(3).repeat_interleave(2),
        group_size=2,
        truncated=torch.zeros(6, dtype=torch.bool),
    )


def _by_hand(policy, hidden: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The reference: the final hidden states -> float -> F.linear with the float32 weight -> log_softmax -> gather."""
    head = policy.base_model.get_output_embeddings()
    logits = F.linear(hidden.float(), head.weight.float())
    return logits.log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


PRECISIONS = {"bf16-autocast": ("float32", autocast), "bf16-weights": ("bfloat16", contextlib.nullcontext)}


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("lean", [True, False], ids=["lean", "plain"])
@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_scoring_log_probs_are_the_float32_head_of_the_hidden_states(make_policy, precision, lean, packed):
    """Prefix-shared (padded) and packed scoring, through `linear_token_log_probs` (lean) or the model's forward."""
    dtype, context = PRECISIONS[precision]
    gaps = {}
    for fp32 in (True, False):
        policy = _policy(make_policy, fp32, dtype=dtype, lean=lean)
        policy.packed_sequences = packed
        policy.share_prompt_prefix = None if not packed else False  # packed: always (no prefix sharing to weigh)
        rollout = _rollout(policy)
        assert policy._packing_pays(rollout) == packed
        with context():
            log_probs, _, hidden = policy.token_log_probs_and_hidden(rollout)
        mask = rollout.response_mask > 0
        expected = _by_hand(policy, hidden.detach(), rollout.response_ids)
        assert log_probs.dtype == torch.float32
        gaps[fp32] = (log_probs.detach() - expected)[mask].abs().max().item()
    assert gaps[True] <= 1e-6
    assert gaps[False] > 1e-4  # the bf16 GEMM's logits: what the option changes


def test_gradients_reach_the_float32_head_under_autocast(make_policy):
    policy = _policy(make_policy, True)
    head = policy.base_model.get_output_embeddings()
    rollout = _rollout(policy)
    with autocast():
        log_probs, _, hidden = policy.token_log_probs_and_hidden(rollout)
        (log_probs * rollout.response_mask).sum().backward()  # inside autocast, as manual_backward under bf16-mixed
    assert head.weight.grad is not None and head.weight.grad.dtype == torch.float32
    weight = head.weight.detach().clone().requires_grad_(True)
    logits = F.linear(hidden.detach().float(), weight)
    expected = token_log_probs_from_logits(logits, rollout.response_ids)
    (expected * rollout.response_mask).sum().backward()
    torch.testing.assert_close(head.weight.grad, weight.grad, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("operands", [torch.float32, BF16])
def test_the_lean_output_layer_keeps_float32_gemms_in_both_passes_under_autocast(operands):
    """`linear_token_log_probs(float32=True)` under bf16 autocast (its backward too): fp32 autograd's values and
    gradients of the float32 operands; gradients reach bf16 operands (a tied bf16 weight) in their dtype."""
    torch.manual_seed(0)
    hidden = (torch.randn(5, 3, 16) * 3).to(operands).requires_grad_(True)
    weight = torch.randn(40, 16).to(operands).requires_grad_(True)
    ids = torch.randint(0, 40, (5, 3))
    with autocast():
        log_probs, _ = linear_token_log_probs(hidden, weight, None, ids, temperature=0.7, float32=True)
        log_probs.sum().backward()
    h32, w32 = hidden.detach().float().requires_grad_(True), weight.detach().float().requires_grad_(True)
    expected = token_log_probs_from_logits(F.linear(h32, w32), ids, temperature=0.7)
    expected.sum().backward()
    torch.testing.assert_close(log_probs, expected, atol=1e-6, rtol=0)
    assert hidden.grad.dtype == operands and weight.grad.dtype == operands
    tolerance = {"atol": 1e-6, "rtol": 1e-5} if operands == torch.float32 else {}
    torch.testing.assert_close(hidden.grad, h32.grad.to(operands), **tolerance)
    torch.testing.assert_close(weight.grad, w32.grad.to(operands), **tolerance)


def test_an_untied_bf16_head_is_stored_in_float32_and_a_tied_one_shares_the_embedding(make_policy):
    untied = _policy(make_policy, True, dtype="bfloat16").base_model
    assert type(untied.lm_head) is Float32Head and untied.lm_head.weight.dtype == torch.float32
    assert untied.model.embed_tokens.weight.dtype == BF16
    tied = _policy(make_policy, True, dtype="bfloat16", tied=True).base_model
    assert type(tied.lm_head) is Float32Head and tied.lm_head.weight is tied.model.embed_tokens.weight
    assert tied.lm_head.weight.dtype == BF16
    assert tied.lm_head.weight.data_ptr() == tied.model.embed_tokens.weight.data_ptr()
    plain = _policy(make_policy, False, dtype="bfloat16").base_model
    assert type(plain.lm_head) is torch.nn.Linear and list(plain.state_dict()) == list(untied.state_dict())


def test_the_reference_scores_with_the_float32_head(make_policy):
    policy = _policy(make_policy, True, dtype="bfloat16")
    reference = policy.create_reference()
    head = reference.base_model.get_output_embeddings()
    assert type(head) is Float32Head and head.weight.dtype == torch.float32
    rollout = _rollout(policy)
    with torch.no_grad():
        ours, _ = policy.token_log_probs(rollout)
    assert torch.equal(policy.reference_log_probs(reference, rollout, 1.0), ours)


def _record_head(policy) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input, logits) of every call of the output layer (the hook travels into the sampling copy)."""
    calls = []
    head = policy.base_model.get_output_embeddings()
    head.register_forward_hook(lambda module, inputs, output: calls.append((inputs[0].detach(), output.detach())))
    return calls


NO_AUTOCAST = contextlib.nullcontext
#: (weights, context, backend, the decoder's output dtype): bf16 weights; fp32 weights under autocast (the model
#: samples as it is); the bf16 copy of fp32 weights (`sampling_precision.py`)
SAMPLERS = {
    "eager-bf16-weights": ("bfloat16", NO_AUTOCAST, lambda: KVCacheGeneration(), BF16),
    "eager-autocast": ("float32", autocast, lambda: KVCacheGeneration(), torch.float32),
    "eager-bf16-copy": ("float32", NO_AUTOCAST, lambda: KVCacheGeneration(dtype="bfloat16"), BF16),
    "static-bf16-weights": ("bfloat16", NO_AUTOCAST, lambda: StaticCacheGeneration(compile="none"), BF16),
    "static-autocast": ("float32", autocast, lambda: StaticCacheGeneration(compile="none"), torch.float32),
    "static-bf16-copy": ("float32", NO_AUTOCAST, lambda: StaticCacheGeneration(dtype="bfloat16", compile="none"), BF16),
}


def _greedy_steps(policy, calls, weight: torch.Tensor, rows: int, steps: int, decoder_dtype=None):
    """The greedy tokens and log-probs `[rows, steps]` of the float32 head's logits, from the inputs the output
    layer saw at each step (checking its logits are exactly those)."""
    eos = torch.tensor(policy.eos_token_ids)
    tokens, log_probs = [], []
    assert len(calls) >= steps
    for inputs, logits in calls[:steps]:
        assert logits.dtype == torch.float32 and (decoder_dtype is None or inputs.dtype == decoder_dtype)
        last = logits[:rows, -1]
        torch.testing.assert_close(last, F.linear(inputs[:rows, -1].float(), weight), atol=1e-6, rtol=0)
        chosen = last.index_fill(-1, eos, float("-inf")).argmax(-1)  # EOS suppressed before min_new_tokens
        tokens.append(chosen)
        log_probs.append(last.log_softmax(-1).gather(-1, chosen.unsqueeze(-1)).squeeze(-1))
    return torch.stack(tokens, 1), torch.stack(log_probs, 1)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_sampling_takes_the_float32_head_logits(make_policy, sampler, tied):
    """Greedy tokens and their recorded log-probs come from float32 logits of the decoder's hidden states and the
    float32 weight (the master weight's values; a tied bf16 weight upcast), step by step."""
    dtype, context, backend, decoder_dtype = SAMPLERS[sampler]
    policy = _policy(make_policy, True, dtype=dtype, tied=tied, generation=GenerationOptions(backend=backend()))
    weight = policy.base_model.get_output_embeddings().weight.detach().float().clone()
    calls = _record_head(policy)
    steps = 4
    sampling = SamplingConfig(max_new_tokens=steps, min_new_tokens=steps, do_sample=False)  # every row decodes 4
    with context():
        rollout = policy.sample(PROMPTS, 1, sampling)
    rows = len(PROMPTS["prompt"])
    tokens, log_probs = _greedy_steps(policy, calls, weight, rows, steps, decoder_dtype)
    assert torch.equal(rollout.response_ids, tokens)
    torch.testing.assert_close(rollout.sampling_log_probs, log_probs, atol=1e-6, rtol=0)


def test_the_compiled_static_step_samples_the_float32_head(make_policy):
    """The float32 head inside `torch.compile(fullgraph=True)` (aot_eager) over the bf16 copy of a tied model (its
    embedding hook in the graph too): one graph, no break, and the tokens and log-probs of the float32 logits of
    the step run eagerly; they are the float32 head's scoring log-probs to the bf16 decoder's rounding."""
    from torch._dynamo.utils import counters

    steps, rows = 8, len(PROMPTS["prompt"])
    sampling = SamplingConfig(max_new_tokens=steps, min_new_tokens=steps, do_sample=False)
    eager = _policy(
        make_policy, True, tied=True, generation=GenerationOptions(backend=StaticCacheGeneration(dtype="bfloat16"))
    )
    weight = eager.base_model.get_output_embeddings().weight.detach().float().clone()
    calls = _record_head(eager)
    eager.sample(PROMPTS, 1, sampling)
    tokens, log_probs = _greedy_steps(eager, calls, weight, rows, steps, BF16)
    torch._dynamo.reset()
    counters.clear()
    backend = StaticCacheGeneration(dtype="bfloat16", compile="aot_eager")
    policy = _policy(make_policy, True, tied=True, generation=GenerationOptions(backend=backend))
    static = policy.sample(PROMPTS, 1, sampling)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    torch._dynamo.reset()
    assert torch.equal(static.response_ids, tokens)
    torch.testing.assert_close(static.sampling_log_probs, log_probs, atol=1e-5, rtol=0)
    with autocast():
        scored, _ = policy.token_log_probs(static)
    assert (scored - static.sampling_log_probs).abs().max() <= 1e-2  # bf16 decoders, float32 heads


def test_a_lora_adapter_on_the_head_is_refused(make_policy):
    with pytest.raises(ValueError, match=r"model\.lm_head_fp32.*lora\.target_modules"):
        _policy(make_policy, True, lora=LoRAOptions(r=4, target_modules=["q_proj", "lm_head"]))
    lora = _policy(make_policy, True, lora=LoRAOptions(r=4))  # all-linear leaves the head out
    assert type(lora.base_model.get_output_embeddings()) is Float32Head


def test_off_by_default(make_policy):
    assert HFModelOptions().lm_head_fp32 is False
    policy = _policy(make_policy, False)
    assert not any(isinstance(m, Float32Head) for m in policy.modules())

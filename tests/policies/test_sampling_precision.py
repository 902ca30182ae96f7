"""Sampling in bf16 over fp32 master weights (`KVCacheGeneration(dtype=...)`, `generation/sampling_precision.py`),
and the sampling log-probs importance sampling reads: those of the unfiltered distribution, never renormalised
after top-k/top-p."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr_lightning.generation.loop import KVCacheGeneration
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.generation.token_sampling import sample_next_token
from rlvr_lightning.policies.hf_options import GenerationOptions, LoRAOptions, PromptOptions

PROMPTS = {"prompt": ["What is 2+3?", "The quick brown"], "metadata": [{}, {}]}
SAMPLING = SamplingConfig(max_new_tokens=6, min_new_tokens=6)


def bf16_policy(make_policy, **kwargs):
    return make_policy(
        prompt=PromptOptions(template="raw"),
        generation=GenerationOptions(backend=KVCacheGeneration(dtype="bfloat16")),
        **kwargs,
    )


def record_head_dtypes(policy) -> list[torch.dtype]:
    """The dtype of every LM-head output from now on (the hook travels into copies of the model)."""
    seen: list[torch.dtype] = []
    policy.base_model.get_output_embeddings().register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    return seen


@pytest.mark.parametrize("value", ["float16", "bf16", "fp32"])
def test_a_bad_sampling_dtype_is_refused_with_the_choices(value):
    with pytest.raises(ValueError) as error:
        KVCacheGeneration(dtype=value)
    assert str(error.value) == (
        f"KVCacheGeneration dtype={value!r} is not valid; choose one of ['float32', 'bfloat16', 'auto']"
    )


@pytest.mark.parametrize("lora", [False, True])
def test_bf16_sampling_runs_a_bf16_pass_and_leaves_the_fp32_weights_alone(make_policy, lora):
    policy = bf16_policy(make_policy, **({"lora": LoRAOptions(r=4)} if lora else {}))
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    seen = record_head_dtypes(policy)
    torch.manual_seed(0)
    rollout = policy.sample(PROMPTS, 3, SAMPLING)
    assert seen and set(seen) == {torch.bfloat16}  # every forward of the sampling pass ran in bf16
    for name, p in policy.named_parameters():
        assert p.dtype == torch.float32 and torch.equal(p, before[name]), name
    assert policy.training  # the trained model's mode is untouched (the copy is the one put in eval mode)
    assert not policy.sampling_log_probs_exact  # the trainer recomputes old log-probs from the fp32 weights
    # the sampling log-probs are the bf16 pass's: close to the fp32 trainer's, not equal
    seen.clear()
    trainer, _ = policy.token_log_probs(rollout)
    assert set(seen) == {torch.float32}
    diff = ((trainer - rollout.sampling_log_probs).abs() * rollout.response_mask).max().item()
    assert 0 < diff < 0.1


def test_float32_sampling_of_fp32_weights_uses_the_model_itself(make_policy):
    policy = make_policy(
        prompt=PromptOptions(template="raw"), generation=GenerationOptions(backend=KVCacheGeneration(dtype="float32"))
    )
    seen = record_head_dtypes(policy)
    torch.manual_seed(0)
    rollout = policy.sample(PROMPTS, 3, SAMPLING)
    assert set(seen) == {torch.float32} and not policy.generation._weights._copies
    trainer, _ = policy.token_log_probs(rollout)
    assert ((trainer - rollout.sampling_log_probs).abs() * rollout.response_mask).max().item() < 1e-4


def test_auto_samples_in_the_autocast_dtype(make_policy):
    """Under autocast through the autocast copy (tests/policies/test_autocast_copy.py), without it the model."""
    policy = make_policy(prompt=PromptOptions(template="raw"))  # KVCacheGeneration(dtype="auto")
    seen = record_head_dtypes(policy)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        policy.sample(PROMPTS, 2, SAMPLING)
    assert set(seen) == {torch.bfloat16} and list(policy.generation._weights._copies) == [(id(policy.model), True)]
    seen.clear()
    policy.sample(PROMPTS, 2, SAMPLING)
    assert set(seen) == {torch.float32}


@pytest.mark.parametrize("how", ["optimizer", "in_place", "lora_optimizer"])
def test_the_bf16_copy_is_refreshed_after_the_weights_change(make_policy, how):
    policy = bf16_policy(make_policy, **({"lora": LoRAOptions(r=4)} if how == "lora_optimizer" else {}))
    torch.manual_seed(0)
    rollout = policy.sample(PROMPTS, 4, SAMPLING)  # builds the copy
    if how == "in_place":
        with torch.no_grad():
            policy.base_model.get_output_embeddings().weight.mul_(3.0)
    else:  # a large step towards token 7 everywhere
        optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=0.5)
        rollout.response_ids.fill_(7)
        log_probs, _ = policy.token_log_probs(rollout)
        (-(log_probs * rollout.response_mask).sum()).backward()
        optimizer.step()
    cast = policy.generation._weights.model_for(policy.model, torch.bfloat16)
    for (name, copied), p in zip(cast.named_parameters(), policy.model.parameters(), strict=True):
        assert torch.equal(copied, p.detach().to(torch.bfloat16)), name  # a stale copy fails here
    torch.manual_seed(1)
    after = policy.sample(PROMPTS, 4, SAMPLING)
    trainer, _ = policy.token_log_probs(after)
    # the sampler and the trainer agree on the new weights (from the old ones it would be far off)
    assert ((trainer - after.sampling_log_probs).abs() * after.response_mask).max().item() < 0.1


def test_a_copy_built_in_inference_mode_is_refreshed_after_an_update(make_policy):
    """`trainer.validate` runs in `torch.inference_mode` (a baseline measured before training): a copy built there
    must still take the next update in place outside it (tests/test_validate_then_fit.py does it through fit)."""
    policy = bf16_policy(make_policy)
    with torch.inference_mode():
        policy.sample(PROMPTS, 2, SAMPLING)  # builds the copy
    rollout = policy.sample(PROMPTS, 2, SAMPLING)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=0.5)
    log_probs, _ = policy.token_log_probs(rollout)
    (-(log_probs * rollout.response_mask).sum()).backward()
    optimizer.step()
    policy.sample(PROMPTS, 2, SAMPLING)  # refreshes the copy
    cast = policy.generation._weights.model_for(policy.model, torch.bfloat16)
    for (name, copied), p in zip(cast.named_parameters(), policy.model.parameters(), strict=True):
        assert torch.equal(copied, p.detach().to(torch.bfloat16)), name


def test_a_sampling_copy_samples_in_bf16_from_its_own_weights(make_policy):
    from rlvr_lightning.modules.async_rollouts import copy_weights

    policy = bf16_policy(make_policy, lora=LoRAOptions(r=4))
    copy = policy.sampling_copy()
    with torch.no_grad():
        for p in policy.parameters():
            if p.requires_grad:
                p.add_(0.05)
    copy_weights(policy, copy)
    seen = record_head_dtypes(copy)
    torch.manual_seed(0)
    from_copy = copy.sample(PROMPTS, 2, SAMPLING)
    assert set(seen) == {torch.bfloat16}
    torch.manual_seed(0)
    assert torch.equal(policy.sample(PROMPTS, 2, SAMPLING).response_ids, from_copy.response_ids)


# -- the log-probs importance sampling reads are the unfiltered distribution's (trl#6789)


@pytest.mark.parametrize(
    "top_k, top_p",
    [(2, 1.0), (0, 0.7), (2, 0.7)],
)
def test_sampling_log_probs_are_not_renormalised_after_truncation(top_k, top_p):
    # p = (0.5, 0.3, 0.15, 0.05): top-2 and top-p 0.7 keep tokens 0 and 1 (0.5 < 0.7 <= 0.8); renormalised, the
    # kept tokens would get 0.5/0.8 = 0.625 and 0.3/0.8 = 0.375. The unfiltered ones are 0.5 and 0.3.
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(4000, 1)
    torch.manual_seed(0)
    tokens, log_probs = sample_next_token(logits, top_k=top_k, top_p=top_p)
    assert set(tokens.tolist()) == {0, 1}
    expected = torch.where(tokens == 0, math.log(0.5), math.log(0.3))
    assert torch.allclose(log_probs, expected, atol=1e-6)
    assert abs((tokens == 0).float().mean().item() - 0.625) < 0.03  # drawn from the truncated distribution


def test_sampling_log_probs_at_a_temperature_are_not_renormalised_either():
    # temperature 2 over log(0.5, 0.3, 0.15, 0.05): p_T ~ sqrt(p) / sum sqrt(p) = (0.3405, 0.2638, 0.1865, 0.1077)
    # after normalisation (sum of square roots 2.0766); top-k 1 keeps token 0 only, whose unfiltered log-prob
    # at temperature 2 is log(0.7071 / 2.0766)
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    tokens, log_probs = sample_next_token(probs.log().repeat(3, 1), temperature=2.0, top_k=1)
    assert tokens.tolist() == [0, 0, 0]
    assert torch.allclose(log_probs, torch.full((3,), math.log(math.sqrt(0.5) / probs.sqrt().sum().item())))


class RenormalisingBackend(KVCacheGeneration):
    """Our loop, claiming log-probs renormalised after top-k/top-p (as vLLM's processed log-probs are)."""

    log_probs_renormalised = True


def test_renormalised_log_probs_are_not_recorded_for_importance_sampling(make_policy):
    from rlvr_lightning.policies import hf

    policy = make_policy(
        prompt=PromptOptions(template="raw"), generation=GenerationOptions(backend=RenormalisingBackend())
    )
    hf.warn_renormalised_log_probs.cache_clear()
    with pytest.warns(UserWarning, match="renormalised over the kept tokens, so the rollouts record no sampling"):
        rollout = policy.sample(PROMPTS, 2, SAMPLING)
    assert rollout.sampling_log_probs is None  # no mismatch metrics and no rollout_is weights from them
    assert make_policy(prompt=PromptOptions(template="raw")).sample(PROMPTS, 2, SAMPLING).sampling_log_probs is not None

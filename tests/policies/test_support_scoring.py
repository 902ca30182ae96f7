"""The log-probs of a support of tokens at each response position (`support_log_probs`, the student of logit-level
distillation) and the top-k tokens (`top_log_probs`, its teacher) equal those read from a plain forward's whole
softmax, row by row, on every scoring path (padded, shared prompt prefix, packed, lean activations, LoRA), with
the same gradients; masked positions get 0."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.policies import ToySortPolicy
from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions, LoRAOptions
from tests.packed_rows import uneven_rollout

TEMPERATURE = 0.7
K = 5


def whole_softmax(policy, rollout) -> torch.Tensor:
    """`[N, T, V]` log-softmax of each response position from one unpadded forward per row (0 where masked)."""
    rows = []
    width = rollout.response_ids.shape[1]
    for i in range(rollout.num_rows):
        prompt = rollout.prompt_ids[i][rollout.prompt_mask[i].bool()]
        ids = torch.cat([prompt, rollout.response_ids[i, : width - 1]]).unsqueeze(
            0
        )  # the response's last predicts none
        logits = policy.model(input_ids=ids).logits[0, len(prompt) - 1 :]
        rows.append(torch.log_softmax(logits.float() / TEMPERATURE, dim=-1))
    full = torch.stack(rows)
    return torch.where(rollout.response_mask.bool().unsqueeze(-1), full, 0.0)


def support_for(rollout, vocab: int, seed: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (*rollout.response_ids.shape, K), generator=g)


def gradients_of(policy, value: torch.Tensor) -> list[torch.Tensor]:
    policy.model.zero_grad()
    value.backward()
    return [p.grad.clone() for p in policy.model.parameters() if p.grad is not None]


PATHS = {
    "padded": dict(generation=GenerationOptions(share_prompt_prefix=False)),
    "shared_prefix": dict(generation=GenerationOptions(share_prompt_prefix=True)),
    "lean": dict(generation=GenerationOptions(share_prompt_prefix=False), model=HFModelOptions(lean_activations=True)),
    "lora": dict(generation=GenerationOptions(share_prompt_prefix=False), lora=LoRAOptions(r=4, alpha=8.0)),
}


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("path", list(PATHS))
def test_support_log_probs_equal_the_whole_softmax(make_policy, path, packed):
    policy = make_policy(**PATHS[path])
    policy.packed_sequences = packed
    vocab = policy.hf_config.vocab_size
    rollout = uneven_rollout(vocab)
    if path == "shared_prefix":  # groups that share prompts, so that the prefix is scored once
        rollout = uneven_rollout(vocab, prompt_lengths=[5] * 6, response_lengths=[1, 14, 6, 0, 3, 9])
        rollout.prompt_ids[:3] = rollout.prompt_ids[0]
        rollout.prompt_ids[3:] = rollout.prompt_ids[3]
    # a trailing column no row uses (a micro-batch of a wider rollout): scored as padding
    rollout.response_ids = torch.nn.functional.pad(rollout.response_ids, (0, 1))
    rollout.response_mask = torch.nn.functional.pad(rollout.response_mask, (0, 1))
    support = support_for(rollout, vocab)
    mask = rollout.response_mask.bool()
    weights = torch.linspace(0.5, 1.5, K)

    log_probs, entropy, on_support = policy.support_log_probs(rollout, support, TEMPERATURE, with_entropy=True)
    ours = gradients_of(policy, (on_support * weights).sum() + log_probs.sum())
    full = whole_softmax(policy, rollout)
    expected = torch.where(mask.unsqueeze(-1), full.gather(-1, support), 0.0)
    chosen = torch.where(mask, full.gather(-1, rollout.response_ids.unsqueeze(-1)).squeeze(-1), 0.0)
    theirs = gradients_of(policy, (expected * weights).sum() + chosen.sum())

    torch.testing.assert_close(on_support.detach(), expected.detach(), atol=1e-5, rtol=0)
    torch.testing.assert_close(log_probs.detach(), chosen.detach(), atol=1e-5, rtol=0)
    assert entropy is not None and entropy.shape == mask.shape
    assert len(ours) == len(theirs) > 0
    for a, b in zip(ours, theirs, strict=True):
        # summed over every position, a weight's gradient reaches ~6: float32 rounding of that order is ~1e-6
        # relative, and AVX-512 kernels sum in another order than AVX2's
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)

    with torch.no_grad():
        top_chosen, top, ids = policy.top_log_probs(rollout, K, TEMPERATURE)
        values, expected_ids = full.topk(K, dim=-1)
    torch.testing.assert_close(top, torch.where(mask.unsqueeze(-1), values, 0.0), atol=1e-5, rtol=0)
    assert torch.equal(ids, torch.where(mask.unsqueeze(-1), expected_ids, 0))
    torch.testing.assert_close(top_chosen, chosen.detach(), atol=1e-5, rtol=0)
    assert bool((top[:, :, :-1] >= top[:, :, 1:]).all())  # most probable first


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("path", list(PATHS))
def test_top_k_scores_find_and_score_the_candidates_in_one_forward(make_policy, path, packed):
    """SimKO's candidates: the top-K of the training forward's own logits, scored with gradients, as the no-grad
    `top_log_probs` finds them and `support_log_probs` scores them in two forwards: the same ids, values and
    gradients, from one forward of the decoder."""
    policy = make_policy(**PATHS[path])
    policy.packed_sequences = packed
    rollout = uneven_rollout(policy.hf_config.vocab_size)
    weights = torch.linspace(0.5, 1.5, K)
    forwards = []
    decoder = policy.base_model.get_decoder()
    hook = decoder.register_forward_hook(lambda *_: forwards.append(1))
    log_probs, entropy, top, ids = policy.top_k_scores(rollout, K, TEMPERATURE, with_entropy=True)
    hook.remove()
    ours = gradients_of(policy, (top * weights).sum() + log_probs.sum())
    assert top.requires_grad and not ids.requires_grad and entropy.shape == log_probs.shape

    one_pass, forwards = len(forwards), []
    hook = decoder.register_forward_hook(lambda *_: forwards.append(1))
    expected_ids = policy.top_log_probs(rollout, K, TEMPERATURE)[2]
    expected_log_probs, _, expected_top = policy.support_log_probs(rollout, expected_ids, TEMPERATURE)
    hook.remove()
    assert one_pass >= 1 and len(forwards) == 2 * one_pass
    theirs = gradients_of(policy, (expected_top * weights).sum() + expected_log_probs.sum())
    assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(top.detach(), expected_top.detach(), atol=1e-6, rtol=0)
    torch.testing.assert_close(log_probs.detach(), expected_log_probs.detach(), atol=1e-6, rtol=0)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_the_toy_policy_scores_a_support_and_its_top_k():
    torch.manual_seed(0)
    policy = ToySortPolicy(vocab_size=10, prompt_length=4, embedding_dim=16)
    batch = {"prompt": [[3, 1, 2, 0], [5, 4, 7, 6]], "metadata": [{}, {}]}
    rollout = policy.sample(batch, 3, SamplingConfig(max_new_tokens=4))
    support = torch.randint(0, 10, (*rollout.response_ids.shape, 4))
    log_probs, _, on_support = policy.support_log_probs(rollout, support, TEMPERATURE)
    logits = policy(rollout.prompt_ids)  # [N, R, V]
    full = torch.log_softmax(logits / TEMPERATURE, dim=-1)
    torch.testing.assert_close(on_support, full.gather(-1, support), atol=1e-5, rtol=0)
    torch.testing.assert_close(log_probs, full.gather(-1, rollout.response_ids.unsqueeze(-1)).squeeze(-1))
    _, top, ids = policy.top_log_probs(rollout, 4, TEMPERATURE)
    values, expected_ids = full.topk(4, dim=-1)
    torch.testing.assert_close(top, values, atol=1e-5, rtol=0)
    assert torch.equal(ids, expected_ids)


def test_a_top_k_over_the_vocabulary_is_refused(make_policy):
    policy = make_policy()
    rollout = uneven_rollout(policy.hf_config.vocab_size)
    vocab = policy.hf_config.vocab_size
    with pytest.raises(ValueError, match=rf"k must be in \[1, {vocab}\] \(the vocabulary\), got {vocab + 1}"):
        policy.top_log_probs(rollout, vocab + 1)

"""The hidden-state hook a PPO value model reads: the last hidden states of the positions that score each
response token, from the same forward as the log-probs (toy policy and a tiny Hugging Face Llama)."""

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.policies.hf_options import GenerationOptions
from rlvr_lightning.policies.toy_sort import ToySortPolicy

PROMPTS = ["What is 2+3?", "The quick brown fox jumps over the lazy dog.", "ab"]


def test_toy_hidden_states_project_to_the_log_probs():
    torch.manual_seed(0)
    policy = ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4)
    rollout = policy.sample({"prompt": [[1, 0, 2], [4, 3, 3]]}, n=3, sampling=SamplingConfig())
    log_probs, entropy, hidden = policy.token_log_probs_and_hidden(rollout, temperature=0.5, with_entropy=True)
    assert hidden.shape == (6, 3, policy.hidden_size) and hidden.requires_grad
    expected = (
        torch.log_softmax(policy.project(hidden) / 0.5, -1).gather(-1, rollout.response_ids.unsqueeze(-1)).squeeze(-1)
    )
    assert_close(log_probs, expected)
    plain, plain_entropy = policy.token_log_probs(rollout, temperature=0.5, with_entropy=True)
    assert torch.equal(plain, log_probs) and torch.equal(plain_entropy, entropy)
    assert torch.equal(policy.response_hidden_states(rollout), hidden)
    assert torch.equal(hidden[3], policy.hidden_states(rollout.prompt_ids[3:4])[0])  # row 3 is prompt 1's


def test_toy_eos_ends_the_response():
    policy = ToySortPolicy(vocab_size=4, prompt_length=2, response_length=4, embedding_dim=4, eos_token=3)
    ids = torch.tensor([[0, 3, 1, 3], [1, 2, 0, 1], [3, 0, 0, 0]])
    mask, truncated = policy._response_mask(ids)
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]  # through the first EOS, EOS included
    assert truncated.tolist() == [False, True, False]
    torch.manual_seed(0)
    rollout = policy.sample({"prompt": [[0, 1]]}, n=64, sampling=SamplingConfig())
    lengths = rollout.response_mask.sum(-1)
    assert len(set(lengths.tolist())) > 1  # lengths vary
    first_eos = (rollout.response_ids == 3).float().argmax(-1) + 1
    assert torch.equal(torch.where(rollout.truncated, 4.0, first_eos.float()), lengths)
    with pytest.raises(ValueError, match="eos_token=7"):
        ToySortPolicy(vocab_size=4, eos_token=7)


@pytest.mark.parametrize("share_prompt_prefix", [True, False])
def test_hf_hidden_states_are_what_the_lm_head_reads(make_policy, share_prompt_prefix):
    policy = make_policy(generation=GenerationOptions(share_prompt_prefix=share_prompt_prefix))
    torch.manual_seed(0)
    rollout = policy.sample({"prompt": PROMPTS}, n=4, sampling=SamplingConfig(max_new_tokens=6))
    log_probs, entropy, hidden = policy.token_log_probs_and_hidden(rollout, temperature=0.7, with_entropy=True)
    plain, plain_entropy = policy.token_log_probs(rollout, temperature=0.7, with_entropy=True)
    assert_close(log_probs, plain) and assert_close(entropy, plain_entropy)
    assert hidden.shape == (*rollout.response_ids.shape, policy.hidden_size) and hidden.requires_grad
    mask = rollout.response_mask.bool()
    head = policy.base_model.get_output_embeddings()
    from_hidden = torch.log_softmax(head(hidden) / 0.7, -1).gather(-1, rollout.response_ids.unsqueeze(-1)).squeeze(-1)
    assert_close(from_hidden[mask], log_probs[mask], atol=1e-5, rtol=1e-5)
    assert (hidden[~mask] == 0).all()
    # the decoder alone (no LM head) gives the same hidden states
    assert_close(policy.response_hidden_states(rollout), hidden, atol=1e-5, rtol=1e-5)


def test_hf_prompt_sharing_does_not_change_the_hidden_states(make_policy):
    shared, joint = (
        make_policy(generation=GenerationOptions(share_prompt_prefix=True)),
        make_policy(generation=GenerationOptions(share_prompt_prefix=False)),
    )
    torch.manual_seed(0)
    rollout = shared.sample({"prompt": PROMPTS}, n=4, sampling=SamplingConfig(max_new_tokens=5))
    assert_close(shared.response_hidden_states(rollout), joint.response_hidden_states(rollout), atol=1e-5, rtol=1e-5)
    assert_close(
        shared.token_log_probs_and_hidden(rollout)[2],
        joint.token_log_probs_and_hidden(rollout)[2],
        atol=1e-5,
        rtol=1e-5,
    )


@pytest.mark.parametrize("share_prompt_prefix", [True, False])
def test_hf_hidden_states_through_the_whole_model(make_policy, share_prompt_prefix):
    """A sharded model gathers the parameters outside its blocks in its own forward: `response_hidden_states` then
    runs the whole model (`decoder_only_hidden_states` off), with the same hidden states."""
    policy = make_policy(generation=GenerationOptions(share_prompt_prefix=share_prompt_prefix))
    torch.manual_seed(0)
    rollout = policy.sample({"prompt": PROMPTS}, n=2, sampling=SamplingConfig(max_new_tokens=5))
    calls = []
    policy.model.register_forward_hook(lambda module, args, output: calls.append(output.logits.shape[1]))
    decoder_only = policy.response_hidden_states(rollout)
    assert calls == []
    policy.decoder_only_hidden_states = False
    whole = policy.response_hidden_states(rollout)
    assert calls and set(calls) == {1}  # one position's logits per forward
    assert_close(whole, decoder_only, atol=1e-5, rtol=1e-5)

"""`Policy.logit_statistics` against the distributions the policies' own log-probs come from (the toy policy and a
tiny Hugging Face Llama): the token energies ``1 - 2 p(y_t) + sum_v p(v)^2`` that `OptimalTokenBaseline` reads, and
the self-certainty ``KL(U || p)`` that `SelfCertaintyReward` reads."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.log_probs import (
    self_certainty_from_logits,
    token_energy_from_logits,
    token_entropy_from_logits,
)
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.policies.hf_options import GenerationOptions
from rlvr_lightning.policies.toy_sort import ToySortPolicy


def _energy_from(logits, ids):
    probs = torch.softmax(logits, -1)
    return 1 - 2 * probs.gather(-1, ids.unsqueeze(-1)).squeeze(-1) + probs.pow(2).sum(-1)


def test_toy_energies_come_from_the_scoring_distribution():
    torch.manual_seed(0)
    policy = ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4, eos_token=4)
    rollout = policy.sample({"prompt": [[1, 0, 2], [4, 3, 3]]}, n=6, sampling=SamplingConfig())
    assert (rollout.response_mask == 0).any()  # some responses end early
    energy = policy.logit_statistics(rollout, token_energy_from_logits, temperature=0.5)
    _, _, hidden = policy.token_log_probs_and_hidden(rollout, temperature=0.5)
    expected = _energy_from(policy.project(hidden).detach() / 0.5, rollout.response_ids)
    mask = rollout.response_mask.bool()
    assert_close(energy[mask], expected[mask])
    assert (energy[~mask] == 0).all() and not energy.requires_grad


@pytest.mark.parametrize("share_prompt_prefix", [True, False])
def test_hf_energies_come_from_the_scoring_distribution(make_policy, share_prompt_prefix):
    policy = make_policy(generation=GenerationOptions(share_prompt_prefix=share_prompt_prefix))
    torch.manual_seed(0)
    prompts = ["What is 2+3?", "The quick brown fox jumps over the lazy dog.", "ab"]
    rollout = policy.sample({"prompt": prompts}, n=4, sampling=SamplingConfig(max_new_tokens=6))
    energy = policy.logit_statistics(rollout, token_energy_from_logits, temperature=0.7)
    _, _, hidden = policy.token_log_probs_and_hidden(rollout, temperature=0.7)
    head = policy.base_model.get_output_embeddings()
    expected = _energy_from(head(hidden).detach() / 0.7, rollout.response_ids)
    mask = rollout.response_mask.bool()
    assert energy.shape == rollout.response_ids.shape and not energy.requires_grad
    assert_close(energy[mask], expected[mask], atol=1e-5, rtol=1e-5)
    assert (energy[~mask] == 0).all()


def _certainty_from(logits):
    log_probs = torch.log_softmax(logits, -1)
    return -math.log(logits.shape[-1]) - log_probs.mean(-1)  # KL(U || p) = sum_v (1/V) log((1/V) / p_v)


def test_self_certainty_by_hand():
    # V = 3: p = (1/2, 1/4, 1/4) -> -log 3 + (log 2 + 2 log 4) / 3 = 0.056633; p = (0.8, 0.1, 0.1) -> 0.510826
    logits = torch.tensor([[[0.5, 0.25, 0.25], [0.8, 0.1, 0.1]]]).log()
    assert_close(self_certainty_from_logits(logits), torch.tensor([[0.056633, 0.510826]]), atol=1e-6, rtol=0)
    assert_close(self_certainty_from_logits(torch.zeros(1, 2, 5)), torch.zeros(1, 2))  # uniform: 0
    # entropies: 1.5 ln 2 = 1.039721 and -0.8 ln 0.8 - 0.2 ln 0.1 = 0.639032; uniform over 5: ln 5
    assert_close(token_entropy_from_logits(logits), torch.tensor([[1.039721, 0.639032]]), atol=1e-6, rtol=0)
    assert_close(token_entropy_from_logits(torch.zeros(1, 1, 5)), torch.tensor([[math.log(5)]]))
    hot = self_certainty_from_logits(torch.tensor([[[0.5, 0.25, 0.25]]]).log(), temperature=0.5)
    assert_close(hot, _certainty_from(torch.tensor([[[0.5, 0.25, 0.25]]]).log() / 0.5))  # p^2 renormalised


def test_toy_self_certainty_comes_from_the_scoring_distribution():
    torch.manual_seed(0)
    policy = ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4, eos_token=4)
    rollout = policy.sample({"prompt": [[1, 0, 2], [4, 3, 3]]}, n=6, sampling=SamplingConfig())
    certainty = policy.logit_statistics(rollout, self_certainty_from_logits, temperature=0.5)
    _, _, hidden = policy.token_log_probs_and_hidden(rollout, temperature=0.5)
    expected = _certainty_from(policy.project(hidden).detach() / 0.5)
    mask = rollout.response_mask.bool()
    assert_close(certainty[mask], expected[mask])
    assert (certainty[~mask] == 0).all() and (certainty[mask] > 0).all()


def test_hf_self_certainty_comes_from_the_scoring_distribution(make_policy):
    policy = make_policy()
    torch.manual_seed(0)
    rollout = policy.sample({"prompt": ["What is 2+3?", "ab"]}, n=3, sampling=SamplingConfig(max_new_tokens=5))
    certainty = policy.logit_statistics(rollout, self_certainty_from_logits, temperature=0.7)
    _, _, hidden = policy.token_log_probs_and_hidden(rollout, temperature=0.7)
    expected = _certainty_from(policy.base_model.get_output_embeddings()(hidden).detach() / 0.7)
    mask = rollout.response_mask.bool()
    assert_close(certainty[mask], expected[mask], atol=1e-5, rtol=1e-5)
    assert (certainty[~mask] == 0).all()

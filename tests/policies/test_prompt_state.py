"""`Policy.prompt_state`, the summary of each prompt FlowRL's learned log Z reads: a language model's is the mean of
its last hidden states over the prompt's tokens but its last, as FlowRL's authors compute it from their joint forward
(verl recipe/flowrl 40dc8ef, `FlowRLActor._forward_micro_batch`), and differentiable; the toy policy's is its prompt
encoding."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.generation.loop import position_ids_from_mask
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.policies.hf_options import LoRAOptions
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from tests.packed_rows import uneven_rollout


def authors_prompt_state(model, rollout) -> torch.Tensor:
    """Restated from the authors' code: one forward over prompt + response (left-padded prompts, right-padded
    responses), `hidden_states[-1][:, : -response_length - 1]`, `verl_F.masked_mean` under the attention mask."""
    input_ids = torch.cat([rollout.prompt_ids, rollout.response_ids], 1)
    attention_mask = torch.cat([rollout.prompt_mask, rollout.response_mask.long()], 1)
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        output_hidden_states=True,
        use_cache=False,
    )
    response_length = rollout.response_ids.shape[1]
    prompts_last_hidden = out.hidden_states[-1][:, : -response_length - 1]
    mask = attention_mask[:, : -response_length - 1].unsqueeze(-1)
    return (prompts_last_hidden * mask).sum(1) / (mask.sum(1) + 1e-8)  # verl_F.masked_mean


@pytest.mark.parametrize("lora", [False, True])
def test_a_language_models_prompt_state_is_the_authors_mean_of_its_prompts_hidden_states(make_policy, lora):
    policy = make_policy(**({"lora": LoRAOptions(r=4)} if lora else {}))
    # uneven left-padded prompts (one of a single token: its mean is over nothing, 0) and right-padded responses
    rollout = uneven_rollout(policy.hf_config.vocab_size, 0, [5, 1, 9, 3], [4, 7, 1, 6])
    rollout.response_mask[1, 2:4] = 1  # no inserted observation here: the authors' mask is the attention mask
    state = policy.prompt_state(rollout)
    assert state.shape == (4, policy.hidden_size)
    with torch.no_grad():
        assert_close(state, authors_prompt_state(policy.model, rollout), atol=1e-5, rtol=1e-5)
    assert state[1].abs().max().item() == 0.0
    state.square().sum().backward()  # the loss reaches the trained weights through it
    trained = [p for p in policy.model.parameters() if p.requires_grad]
    assert trained and any(p.grad is not None and p.grad.abs().sum() > 0 for p in trained)


def test_the_toy_policys_prompt_state_is_its_prompt_encoding():
    torch.manual_seed(0)
    policy = ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4)
    rollout = policy.sample({"prompt": [[1, 0, 2], [4, 3, 3]]}, n=2, sampling=SamplingConfig())
    state = policy.prompt_state(rollout)
    assert state.shape == (4, policy.hidden_size) and state.requires_grad
    assert torch.equal(state[2], policy.encode(torch.tensor([[4, 3, 3]]))[0])

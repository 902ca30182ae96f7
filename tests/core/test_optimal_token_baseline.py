"""The Optimal Token Baseline (OTB): hand examples, the token energy as the squared norm of a logit gradient, and
verl's single-turn and multi-turn estimators restated (tests/core/verl_restated.py)."""

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.advantage_estimators import optimal_token_baseline_advantages
from rlvr_lightning.core.log_probs import token_energy_from_logits
from tests.core.verl_restated import verl_optimal_token_baseline, verl_tir_optimal_token_baseline


def test_hand_example_weighs_rewards_by_realized_energy():
    # group 1: lengths 2 and 3, rewards 0 and 1; realized energy W = [.5, .75] and [.5, 1, 2]
    #   B_0 = (0 * .5 + 1 * .5) / 1 = .5, B_1 = (0 * .75 + 1 * 1) / 1.75 = 4/7, B_2 = 1 * 2 / 2 = 1, but the single
    #   longest response has no baseline past the second longest (zero_tail): 0
    # group 2: a tool observation (mask 0, energy 9) between two sampled tokens; equal lengths, W = [1, 2] each
    #   B_0 = 1 * 1 / 2 = .5, B_1 = 1 * 2 / 4 = .5
    # group 3: one empty response: fewer than two non-empty responses, no baseline
    mask = torch.tensor(
        [[1, 1, 0], [1, 1, 1], [1, 0, 1], [1, 1, 0], [0, 0, 0], [1, 1, 0]], dtype=torch.float32
    )  # fmt: skip
    energy = torch.tensor(
        [[0.5, 0.25, 0.0], [0.5, 0.5, 1.0], [1.0, 9.0, 1.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]
    )
    rewards = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0, 1.0])
    expected = torch.tensor(
        [[-0.5, -4 / 7, 0.0], [0.5, 3 / 7, 1.0], [0.5, 0.0, 0.5], [-0.5, -0.5, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]
    )
    assert_close(optimal_token_baseline_advantages(rewards, mask, energy, group_size=2, eps=0.0), expected)
    without_tail = expected.clone()
    without_tail[1, 2] = 0.0  # the longest response's own reward is its baseline there
    assert_close(
        optimal_token_baseline_advantages(rewards, mask, energy, group_size=2, zero_tail=False, eps=0.0), without_tail
    )


def test_groups_must_tile_the_rows():
    with pytest.raises(ValueError, match="group_size=4 must be >= 1 and divide the number of rewards"):
        optimal_token_baseline_advantages(torch.zeros(6), torch.ones(6, 2), torch.ones(6, 2), group_size=4)


def test_equal_energies_and_lengths_give_the_group_mean():
    mask = torch.ones(4, 3)
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    out = optimal_token_baseline_advantages(rewards, mask, torch.full((4, 3), 0.3), group_size=4, eps=0.0)
    assert_close(out, (rewards - 0.25).unsqueeze(-1).expand(4, 3))


def test_token_energy_is_the_squared_norm_of_the_log_prob_gradient_in_the_logits():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=generator, dtype=torch.float64) * 3
    ids = torch.randint(0, 11, (3, 5), generator=generator)
    for temperature in (1.0, 0.7):
        scaled = (logits / temperature).requires_grad_()
        chosen = torch.log_softmax(scaled, dim=-1).gather(-1, ids.unsqueeze(-1)).sum()
        (grad,) = torch.autograd.grad(chosen, scaled)  # onehot(y) - p at each position
        assert_close(token_energy_from_logits(logits, ids, temperature), grad.pow(2).sum(-1))


def test_token_energy_bounds_and_chunks():
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(40, 7, 50, generator=generator)
    ids = torch.randint(0, 50, (40, 7), generator=generator)
    energy = token_energy_from_logits(logits, ids)
    probs = torch.softmax(logits, -1)
    p_y = probs.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    assert_close(energy, 1 - 2 * p_y + probs.pow(2).sum(-1))
    assert (energy >= 0).all() and (energy <= 2).all()
    certain = torch.full((1, 1, 4), -1e4)
    certain[..., 2] = 0.0
    assert_close(token_energy_from_logits(certain, torch.tensor([[2]])), torch.zeros(1, 1))  # no gradient left
    assert token_energy_from_logits(torch.zeros(0, 3, 4), torch.zeros(0, 3, dtype=torch.long)).shape == (0, 3)


def _rollout(seed: int, multi_turn: bool, groups: int = 3, group_size: int = 4, width: int = 9):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (groups * group_size,), generator=generator)
    lengths[0] = lengths[1]  # a group whose longest is not unique
    lengths[4] = 0  # an empty response
    mask = (torch.arange(width) < lengths.unsqueeze(-1)).double()
    if multi_turn:  # tool observations: masked tokens before the end
        mask = mask * (torch.rand(mask.shape, generator=generator) > 0.3).double()
    rewards = torch.rand(groups * group_size, generator=generator, dtype=torch.float64)
    old_log_probs = -torch.rand(mask.shape, generator=generator, dtype=torch.float64) * 3
    sum_pi_squared = torch.rand(mask.shape, generator=generator, dtype=torch.float64) * old_log_probs.exp() ** 2 + (
        old_log_probs.exp() ** 2
    )
    token_level_rewards = torch.zeros_like(mask)
    for i in range(mask.shape[0]):
        sampled = mask[i].nonzero()
        if sampled.numel():
            token_level_rewards[i, sampled[-1]] = rewards[i]  # the outcome reward on the last sampled token
    index = [i // group_size for i in range(groups * group_size)]
    energy = (1 - 2 * old_log_probs.exp() + sum_pi_squared) * mask
    return rewards, mask, energy, (token_level_rewards, mask, index, old_log_probs, sum_pi_squared)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_matches_verl_single_turn(seed):
    rewards, mask, energy, verl_inputs = _rollout(seed, multi_turn=False)
    expected = verl_optimal_token_baseline(*verl_inputs)
    assert_close(optimal_token_baseline_advantages(rewards, mask, energy, group_size=4), expected)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("zero_tail", [True, False])
def test_matches_verl_multi_turn(seed, zero_tail):
    rewards, mask, energy, verl_inputs = _rollout(seed, multi_turn=True)
    expected = verl_tir_optimal_token_baseline(*verl_inputs, handle_zero_tail=zero_tail)
    ours = optimal_token_baseline_advantages(rewards, mask, energy, group_size=4, zero_tail=zero_tail)
    assert_close(ours, expected)

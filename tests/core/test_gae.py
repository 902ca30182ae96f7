"""GAE against hand-computed examples (full, discounted, ragged and interior masks) and the
gamma = lam = 1 identity: advantages are returns minus values."""

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.gae import gae_advantages, length_adaptive_lambda, outcome_token_rewards


def test_outcome_reward_sits_on_the_last_real_token():
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    out = outcome_token_rewards(torch.tensor([1.0, 2.0, 3.0]), mask)
    assert_close(out, torch.tensor([[0.0, 0.0, 1.0], [2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))  # no token: nowhere to put 3
    assert outcome_token_rewards(torch.tensor([1, 0]), torch.ones(2, 2)).dtype == torch.float32


def test_gamma_lambda_one_by_hand():
    # r = [0, 0, 1], V = [.5, .2, .4]: A_2 = 1 - .4 = .6; A_1 = (.4 - .2) + .6 = .8; A_0 = (.2 - .5) + .8 = .5
    values = torch.tensor([[0.5, 0.2, 0.4]])
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    advantages, returns = gae_advantages(rewards, values, torch.ones(1, 3), gamma=1.0, lam=1.0)
    assert_close(advantages, torch.tensor([[0.5, 0.8, 0.6]]))
    assert_close(returns, torch.tensor([[1.0, 1.0, 1.0]]))


def test_discounted_by_hand():
    # gamma .9, lam .5: delta_2 = 1 - .4 = .6, A_2 = .6; delta_1 = .9 * .4 - .2 = .16, A_1 = .16 + .45 * .6 = .43;
    # delta_0 = .9 * .2 - .5 = -.32, A_0 = -.32 + .45 * .43 = -.1265; R = A + V
    values = torch.tensor([[0.5, 0.2, 0.4]])
    advantages, returns = gae_advantages(torch.tensor([[0.0, 0.0, 1.0]]), values, torch.ones(1, 3), gamma=0.9, lam=0.5)
    assert_close(advantages, torch.tensor([[-0.1265, 0.43, 0.6]]))
    assert_close(returns, torch.tensor([[0.3735, 0.63, 1.0]]))


def test_ragged_rows_end_where_their_mask_ends():
    # row 1 ends after 2 tokens: its values beyond (9, 9) must not leak in, its bootstrap value is 0
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    values = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, 0.5, 9.0, 9.0]])
    rewards = outcome_token_rewards(torch.tensor([1.0, 2.0]), mask)
    advantages, returns = gae_advantages(rewards, values, mask, gamma=0.5, lam=1.0)
    # row 1: A_1 = 2 - .5 = 1.5; A_0 = (.5 * .5 - 1) + .5 * 1.5 = 0; R = [1, 2]  (= .5 * 2 and 2)
    assert_close(advantages[1], torch.tensor([0.0, 1.5, 0.0, 0.0]))
    assert_close(returns[1], torch.tensor([1.0, 2.0, 0.0, 0.0]))
    # row 0: V = 0, so A = R = 0.5^(3 - t)
    assert_close(advantages[0], torch.tensor([0.125, 0.25, 0.5, 1.0]))


def test_interior_masked_token_is_skipped():
    # verl's observation tokens: t = 1 is masked; t = 0 bootstraps from V(s_2) with one discount step
    # A_2 = 1 - .6 = .4; A_0 = (.5 * .6 - .3) + .5 * .4 = .2; R_0 = .5 = gamma * 1
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    advantages, returns = gae_advantages(
        torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.3, 7.0, 0.6]]), mask, 0.5, 1.0
    )
    assert_close(advantages, torch.tensor([[0.2, 0.0, 0.4]]))
    assert_close(returns, torch.tensor([[0.5, 0.0, 1.0]]))


def test_gamma_lambda_one_is_returns_minus_values_on_ragged_batches():
    torch.manual_seed(0)
    lengths = torch.tensor([5, 1, 3, 0, 4])
    mask = (torch.arange(5).unsqueeze(0) < lengths.unsqueeze(1)).float()
    rewards = torch.randn(5, 5) * mask
    values = torch.randn(5, 5)
    advantages, returns = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    reward_to_go = rewards.flip(-1).cumsum(-1).flip(-1)
    assert_close(returns, reward_to_go * mask)
    assert_close(advantages, (reward_to_go - values) * mask)
    assert not values.requires_grad and not advantages.requires_grad


def test_lambda_zero_is_the_one_step_td_error():
    values = torch.tensor([[0.5, 0.2, 0.4]])
    rewards = torch.tensor([[0.1, 0.0, 1.0]])
    advantages, _ = gae_advantages(rewards, values, torch.ones(1, 3), gamma=0.9, lam=0.0)
    # delta_t = r_t + .9 V_{t+1} - V_t
    assert_close(advantages, torch.tensor([[0.1 + 0.18 - 0.5, 0.36 - 0.2, 0.6]]))


def test_bad_arguments_say_what_is_wrong():
    with pytest.raises(ValueError, match="gamma and lam must be in"):
        gae_advantages(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), gamma=1.5)
    with pytest.raises(ValueError, match="must all be"):
        gae_advantages(torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1, 2))
    with pytest.raises(ValueError, match="rewards must be"):
        outcome_token_rewards(torch.zeros(2, 1), torch.ones(2, 1))


def test_a_lambda_per_row_is_each_rows_own_gae():
    # row 0 with lam .5 is the hand example above (gamma .9); row 1 with lam 1 its gamma-discounted sum
    values = torch.tensor([[0.5, 0.2, 0.4], [0.5, 0.2, 0.4]])
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    advantages, returns = gae_advantages(rewards, values, torch.ones(2, 3), gamma=0.9, lam=torch.tensor([0.5, 1.0]))
    assert_close(advantages[0], torch.tensor([-0.1265, 0.43, 0.6]))
    one, _ = gae_advantages(rewards[1:], values[1:], torch.ones(1, 3), gamma=0.9, lam=1.0)
    assert_close(advantages[1:], one)
    assert_close(returns, advantages + values)
    with pytest.raises(ValueError, match="a lam per row must be \\[N\\]"):
        gae_advantages(rewards, values, torch.ones(2, 3), lam=torch.tensor([0.5]))
    with pytest.raises(ValueError, match="gamma and lam must be in \\[0, 1\\]"):
        gae_advantages(rewards, values, torch.ones(2, 3), lam=torch.tensor([0.5, 1.5]))


def test_length_adaptive_lambda_by_hand():
    # alpha .05: 1 - 1/(.05 l): l = 1000 -> .98, l = 40 -> .5, l = 20 -> 0, l = 10 -> -1, clipped to 0
    out = length_adaptive_lambda(torch.tensor([1000, 40, 20, 10]), alpha=0.05)
    assert_close(out, torch.tensor([0.98, 0.5, 0.0, 0.0]))
    with pytest.raises(ValueError, match="alpha must be > 0"):
        length_adaptive_lambda(torch.tensor([4]), alpha=0.0)

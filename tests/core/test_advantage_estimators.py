import math

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.advantage_estimators import (
    STD_SCOPES,
    batch_whitened_advantages,
    centered_advantages,
    discounted_returns,
    greedy_baseline_advantages,
    length_weighted_centered_advantages,
    max_only_advantages,
    normalized_advantages,
    raw_advantages,
    rloo_advantages,
    token_whitened_returns,
    uniform_reward_groups,
    zero_variance_group_fraction,
    zero_variance_group_mask,
)

S = 1.0 / math.sqrt(2.0)  # 0.7071...


def test_raw_returns_rewards_as_float():
    out = raw_advantages(torch.tensor([1, 0, 0, 1]), group_size=2)
    assert out.dtype == torch.float32
    assert_close(out, torch.tensor([1.0, 0.0, 0.0, 1.0]))


def test_centered_flat_and_grouped():
    assert_close(centered_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 2), torch.tensor([0.5, -0.5, -0.5, 0.5]))
    assert_close(centered_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4), torch.tensor([0.75, -0.25, -0.25, -0.25]))
    grouped = centered_advantages(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    assert grouped.shape == (2, 2)
    assert_close(grouped, torch.tensor([[0.5, -0.5], [-0.5, 0.5]]))


def test_normalized_group_std_unbiased():
    # group {1, 0}: mean .5, unbiased std sqrt(.5) -> .5 / .7071 = .7071
    out = normalized_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 2, eps=0.0)
    assert_close(out, torch.tensor([S, -S, -S, S]))
    # group {1,0,0,0}: mean .25, unbiased var (.5625 + 3 * .0625) / 3 = .25 -> std .5
    out = normalized_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, eps=0.0)
    assert_close(out, torch.tensor([1.5, -0.5, -0.5, -0.5]))


def test_normalized_biased_std():
    # group {1, 0}: biased std .5 -> +-1
    out = normalized_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 2, eps=0.0, unbiased_std=False)
    assert_close(out, torch.tensor([1.0, -1.0, -1.0, 1.0]))


def test_normalized_zero_variance_group_is_zero_not_nan():
    out = normalized_advantages(torch.tensor([1.0, 1.0, 0.0, 1.0]), 2)
    assert_close(out, torch.tensor([0.0, 0.0, -S, S]), atol=1e-5, rtol=1e-5)


def test_normalized_batch_std_scope():
    # group means .5 and 1 -> centred [.5, -.5, 0, 0]; batch {1,0,1,1}: unbiased std .5
    out = normalized_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), 2, eps=0.0, std_scope="batch")
    assert_close(out, torch.tensor([1.0, -1.0, 0.0, 0.0]))


def test_normalized_rejects_bad_std_scope_and_single_sample_groups():
    with pytest.raises(ValueError, match=r"'groupp'.*group, batch"):
        normalized_advantages(torch.tensor([1.0, 0.0]), 2, std_scope="groupp")
    with pytest.raises(ValueError, match="single sample"):
        normalized_advantages(torch.tensor([1.0, 0.0]), 1)


def test_max_only_keeps_group_max():
    assert_close(max_only_advantages(torch.tensor([0.5, 0.2, 0.3, 0.3]), 2), torch.tensor([0.5, 0.0, 0.3, 0.3]))
    assert_close(max_only_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 2), torch.tensor([1.0, 0.0, 0.0, 1.0]))


def test_rloo_leave_one_out():
    # row 0: 1 - mean(0,0,0) = 1; others: 0 - mean(1,0,0) = -1/3
    out = rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4)
    assert_close(out, torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))
    with pytest.raises(ValueError, match="group_size >= 2"):
        rloo_advantages(torch.tensor([1.0, 0.0]), 1)


def test_batch_whitened_ignores_groups():
    # mean .25, unbiased std .5
    assert_close(
        batch_whitened_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), eps=0.0), torch.tensor([1.5, -0.5, -0.5, -0.5])
    )
    out = batch_whitened_advantages(torch.tensor([[3.0, 1.0]]), eps=0.0)  # mean 2, std sqrt 2
    assert out.shape == (1, 2)
    assert_close(out, torch.tensor([[S, -S]]))


def test_estimator_options():
    out = normalized_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 2, eps=0.0, unbiased_std=False)
    assert_close(out, torch.tensor([1.0, -1.0, -1.0, 1.0]))
    assert_close(rloo_advantages(torch.tensor([1.0, 0.0]), 2), torch.tensor([1.0, -1.0]))


def test_shape_validation():
    with pytest.raises(ValueError, match="group_size is required"):
        centered_advantages(torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="divide"):
        centered_advantages(torch.tensor([1.0, 0.0, 1.0]), 2)
    with pytest.raises(ValueError, match="does not match"):
        centered_advantages(torch.tensor([[1.0, 0.0]]), 3)


def test_zero_variance_groups():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    assert zero_variance_group_mask(rewards, 2).tolist() == [True, False, True]
    assert_close(zero_variance_group_fraction(rewards, 2), torch.tensor(2 / 3))
    assert zero_variance_group_fraction(torch.tensor([1.0, 0.0]), 2).item() == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("group_size", [3, 8])
@pytest.mark.parametrize("value", [0.9, 0.3, 0.1])
def test_identical_non_dyadic_rewards_get_exactly_zero_advantage(value, group_size, dtype):
    # e.g. three float32 0.9s: their mean is off by ~1e-8, and that residue divided by (std ~1e-8 + 1e-6)
    # was |A| = 0.056 (eight 0.3s: 0.029, eight 0.1s: 0.0074, three float64 0.1s: 1e-11)
    same = torch.full((group_size,), value, dtype=dtype)
    informative = torch.zeros(group_size, dtype=dtype)
    informative[0] = 1.0
    rewards = torch.cat([same, informative])
    for scope in STD_SCOPES:
        out = normalized_advantages(rewards, group_size, std_scope=scope)
        assert out[:group_size].tolist() == [0.0] * group_size, (scope, out)
        assert out[group_size:].abs().min() > 0.1  # the informative group keeps its advantages
    assert batch_whitened_advantages(same).tolist() == [0.0] * group_size
    assert token_whitened_returns(same, torch.ones(group_size, 2)).tolist() == [[0.0, 0.0]] * group_size
    assert zero_variance_group_mask(rewards, group_size).tolist() == [True, False]


def test_zero_variance_tolerance_is_relative_to_the_reward_scale():
    # 0.1 + 0.2 and 0.3 differ by one float64 ulp: equal; 1e-9 and 2e-9 differ by 100%: not equal
    assert zero_variance_group_mask(torch.tensor([0.1 + 0.2, 0.3], dtype=torch.float64), 2).tolist() == [True]
    assert zero_variance_group_mask(torch.tensor([1e-9, 2e-9], dtype=torch.float64), 2).tolist() == [False]
    assert zero_variance_group_mask(torch.tensor([0.0, 0.0, 1000.0, 1000.0001]), 2).tolist() == [True, True]


def test_discounted_returns_hand_values():
    # rewards 1 and 2 at the last token of responses of 3 and 1 tokens, gamma 0.5: G_t = 0.5^(L-1-t) r
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    out = discounted_returns(torch.tensor([1.0, 2.0]), mask, gamma=0.5)
    assert_close(out, torch.tensor([[0.25, 0.5, 1.0, 0.0], [2.0, 0.0, 0.0, 0.0]]))
    assert_close(
        discounted_returns(torch.tensor([1.0, 2.0]), mask), torch.tensor([[1.0, 1.0, 1.0, 0.0], [2.0, 0.0, 0.0, 0.0]])
    )
    with pytest.raises(ValueError, match="gamma"):
        discounted_returns(torch.tensor([1.0]), torch.ones(1, 1), gamma=1.5)


def test_discounted_returns_with_holes_count_only_sampled_tokens():
    # a tool observation (mask 0) at positions 2-3: the reward sits at the last sampled token (4); the discount
    # counts the policy's steps after t, not the observation: G = 0.5^(sampled tokens after t) r
    mask = torch.tensor([[1, 1, 0, 0, 1, 0]])
    assert_close(
        discounted_returns(torch.tensor([1.0]), mask, gamma=0.5), torch.tensor([[0.25, 0.5, 0.0, 0.0, 1.0, 0.0]])
    )


def test_token_whitened_returns_weigh_every_token():
    # returns [[1, 1, -], [0, -, -]]: token mean 2/3, unbiased var ((1/3)^2 * 2 + (2/3)^2) / 2 = 1/3
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = token_whitened_returns(torch.tensor([1.0, 0.0]), mask, eps=0.0)
    s3 = 1.0 / math.sqrt(3.0)
    assert_close(out, torch.tensor([[(1 / 3) / s3, (1 / 3) / s3, 0.0], [-(2 / 3) / s3, 0.0, 0.0]]))
    # per response (ours by default) the same rewards whiten to +-0.7071 whatever the lengths
    assert_close(batch_whitened_advantages(torch.tensor([1.0, 0.0]), eps=0.0), torch.tensor([S, -S]))


def test_token_whitened_returns_with_discount():
    # gamma 0.5: returns [[0.5, 1, -], [0, -, -]]; mean 0.5, unbiased var (0 + .25 + .25) / 2 = .25 -> std .5
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = token_whitened_returns(torch.tensor([1.0, 0.0]), mask, gamma=0.5, eps=0.0)
    assert_close(out, torch.tensor([[0.0, 1.0, 0.0], [-1.0, 0.0, 0.0]]))


def test_batch_whitened_callback_options():
    from types import SimpleNamespace

    from rlvr_lightning.advantages import BatchWhitenedAdvantage

    rollout = SimpleNamespace(
        reward=torch.tensor([1.0, 0.0]), group_size=1, response_mask=torch.tensor([[1, 1, 0], [1, 0, 0]])
    )
    assert_close(BatchWhitenedAdvantage(eps=0.0).compute(rollout), torch.tensor([S, -S]))  # default: per response
    token = BatchWhitenedAdvantage(eps=0.0, whiten="token", gamma=0.5).compute(rollout)
    assert_close(token, torch.tensor([[0.0, 1.0, 0.0], [-1.0, 0.0, 0.0]]))  # hand values above
    with pytest.raises(ValueError, match="whiten='tokens' is not valid; choose one of .*'token'"):
        BatchWhitenedAdvantage(whiten="tokens")
    with pytest.raises(ValueError, match="needs whiten='token'"):
        BatchWhitenedAdvantage(gamma=0.9)
    with pytest.raises(ValueError, match="baseline='group' is not valid; choose one of .*'group_mean'"):
        BatchWhitenedAdvantage(baseline="group")


def test_reinforce_pp_baseline_subtracts_the_group_mean_before_whitening():
    from types import SimpleNamespace

    from rlvr_lightning.advantages import BatchWhitenedAdvantage

    # groups [3, 1] and [0, 0]: centred [1, -1, 0, 0], mean 0, unbiased std sqrt(2/3) -> [1.2247, -1.2247, 0, 0];
    # the group whose rewards agree gets 0 (without the baseline: [3, 1, 0, 0] whiten to [1.414, 0, -.707, -.707])
    rollout = SimpleNamespace(reward=torch.tensor([3.0, 1.0, 0.0, 0.0]), group_size=2, response_mask=None)
    a = 1 / math.sqrt(2 / 3)
    assert_close(BatchWhitenedAdvantage(eps=0.0, baseline="group_mean").compute(rollout), torch.tensor([a, -a, 0, 0]))
    assert_close(BatchWhitenedAdvantage(eps=0.0).compute(rollout), torch.tensor([2, 0, -1, -1]) / math.sqrt(2))
    with pytest.raises(ValueError, match="BatchWhitenedAdvantage needs group_size >= 2"):
        BatchWhitenedAdvantage(baseline="group_mean").check_group_size(1)
    BatchWhitenedAdvantage().check_group_size(1)


def test_opo_baseline_weighs_rewards_by_length():
    from types import SimpleNamespace

    from rlvr_lightning.advantages import CenteredAdvantage

    # a group of rewards [1, 0] with lengths [3, 1]: baseline (3 * 1 + 1 * 0) / 4 = 0.75 -> [0.25, -0.75]
    # (the plain mean 0.5 gives [0.5, -0.5]); a group of empty responses has baseline 0
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0], [0, 0, 0]])
    rollout = SimpleNamespace(reward=torch.tensor([1.0, 0.0, 2.0, 2.0]), group_size=2, response_mask=mask)
    opo = CenteredAdvantage(baseline="length_weighted").compute(rollout)
    assert_close(opo, torch.tensor([0.25, -0.75, 2.0, 2.0]))
    assert_close(CenteredAdvantage().compute(rollout), torch.tensor([0.5, -0.5, 0.0, 0.0]))
    with pytest.raises(ValueError, match="baseline='length' is not valid; choose one of .*'length_weighted'"):
        CenteredAdvantage(baseline="length")


@pytest.mark.parametrize("seed", range(3))
def test_opo_matches_verl(seed):
    from tests.core.verl_restated import verl_opo

    generator = torch.Generator().manual_seed(seed)
    rewards = torch.rand(12, generator=generator, dtype=torch.float64)
    lengths = torch.randint(1, 6, (12,), generator=generator)
    mask = (torch.arange(5) < lengths[:, None]).double()
    token_rewards = torch.zeros(12, 5, dtype=torch.float64)
    token_rewards[torch.arange(12), lengths - 1] = rewards
    expected = verl_opo(token_rewards, mask, index=[i // 4 for i in range(12)])
    ours = length_weighted_centered_advantages(rewards, mask.sum(-1), group_size=4)
    assert_close(ours[:, None] * mask, expected)


@pytest.mark.parametrize("seed", range(3))
def test_reinforce_pp_baseline_per_token_matches_verl(seed):
    from types import SimpleNamespace

    from rlvr_lightning.advantages import BatchWhitenedAdvantage
    from tests.core.verl_restated import verl_reinforce_pp_baseline

    generator = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 3, (12,), generator=generator).double()
    lengths = torch.randint(1, 6, (12,), generator=generator)
    mask = (torch.arange(5) < lengths[:, None]).double()
    token_rewards = torch.zeros(12, 5, dtype=torch.float64)
    token_rewards[torch.arange(12), lengths - 1] = rewards  # verl's outcome reward at the last token
    expected = verl_reinforce_pp_baseline(token_rewards, mask, index=[i // 4 for i in range(12)])
    rollout = SimpleNamespace(reward=rewards, group_size=4, response_mask=mask)
    assert_close(BatchWhitenedAdvantage(whiten="token", baseline="group_mean").compute(rollout), expected)


def test_greedy_baseline_subtracts_the_greedy_responses_reward():
    # ReMax: two prompts, two responses each; greedy rewards 1 and 0
    out = greedy_baseline_advantages(torch.tensor([1, 0, 1, 1]), torch.tensor([1.0, 1.0, 0.0, 0.0]))
    assert out.dtype == torch.float32
    assert_close(out, torch.tensor([0.0, -1.0, 1.0, 1.0]))


def test_greedy_baseline_matches_verl():
    from tests.core.verl_restated import verl_remax

    generator = torch.Generator().manual_seed(0)
    rewards, baselines = torch.rand(6, generator=generator), torch.rand(6, generator=generator)
    mask = (torch.arange(5) < torch.tensor([5, 3, 1, 4, 2, 5]).unsqueeze(-1)).float()
    token_rewards = torch.zeros(6, 5)
    token_rewards[torch.arange(6), mask.sum(-1).long() - 1] = rewards
    expected = verl_remax(token_rewards, baselines, mask)
    assert_close(greedy_baseline_advantages(rewards, baselines)[:, None] * mask, expected)


def test_uniform_reward_groups_by_index_in_any_row_order():
    # prompt 3: 0.1 + 0.2 and 0.3 agree to float rounding; prompt 0 differs; prompt 1 has one row; 2 and 4 are absent
    rewards = torch.tensor([0.1 + 0.2, 1.0, 0.3, 0.0, 5.0])
    group_index = torch.tensor([3, 0, 3, 0, 1])
    assert uniform_reward_groups(rewards, group_index, 5).tolist() == [False, True, False, True, False]
    assert uniform_reward_groups(torch.tensor([1, 1, 0]), torch.tensor([0, 0, 1]), 2).tolist() == [True, True]

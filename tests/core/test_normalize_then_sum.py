"""GDPO's normalise-then-sum advantages: a hand-computed example, TRL's own branch restated line by line
(`trl_restated.py`, 1e-6 in float64), and the callback's weights and checks."""

import math
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.advantages import NormalizeThenSumAdvantage
from rlvr_lightning.core.advantage_estimators import normalize_then_sum_advantages, normalized_advantages
from rlvr_lightning.rewards import SortDistanceReward, SortInclusionOrderingReward
from rlvr_lightning.rollout import Rollout
from tests.core.trl_restated import trl_normalize_then_sum

ROOT_HALF = math.sqrt(0.5)


def test_hand_computed_two_rewards_two_groups():
    # group 1: reward 1 (1, 0) and reward 2 (0, 10) pull opposite ways; group 2: reward 1 all equal, reward 2 (5, 0)
    rewards = torch.tensor([[1.0, 0.0], [0.0, 10.0], [1.0, 5.0], [1.0, 0.0]], dtype=torch.float64)
    # per reward and group (r - mean) / std (unbiased std of two values d apart: d / sqrt 2):
    # reward 1 (sqrt .5, -sqrt .5, 0, 0), reward 2 (-sqrt .5, sqrt .5, sqrt .5, -sqrt .5); sum (0, 0, sqrt .5, -sqrt .5)
    # over the batch: mean 0, unbiased std sqrt(1 / 3) -> (0, 0, sqrt 1.5, -sqrt 1.5)
    advantages = normalize_then_sum_advantages(rewards, torch.tensor([1.0, 1.0]), group_size=2, eps=0.0)
    assert_close(advantages, torch.tensor([0.0, 0.0, math.sqrt(1.5), -math.sqrt(1.5)], dtype=torch.float64))
    # GRPO on the summed reward (1, 10, 6, 1): the reward of larger spread decides group 1 alone
    grpo = normalized_advantages(rewards.sum(dim=1), group_size=2, eps=0.0)
    assert_close(grpo, torch.tensor([-ROOT_HALF, ROOT_HALF, ROOT_HALF, -ROOT_HALF], dtype=torch.float64))
    # a weight of 0 leaves a reward out; all rewards equal: 0
    only_first = normalize_then_sum_advantages(rewards, torch.tensor([1.0, 0.0]), group_size=2, eps=0.0)
    assert_close(only_first, torch.tensor([1.0, -1.0, 0.0, 0.0], dtype=torch.float64) * math.sqrt(1.5))
    assert torch.count_nonzero(normalize_then_sum_advantages(torch.ones(4, 2), torch.ones(2), 2)) == 0


@pytest.mark.parametrize("seed", range(5))
def test_matches_trls_normalize_then_sum(seed):
    generator = torch.Generator().manual_seed(seed)
    group_size, groups, rewards_count = 4, 5, 3
    rewards = torch.randn(groups * group_size, rewards_count, generator=generator, dtype=torch.float64)
    rewards[:, 1] = torch.randint(0, 2, (groups * group_size,), generator=generator).double()  # a 0/1 reward
    rewards[:group_size, 1] = 1.0  # one group all correct: that reward gives it 0
    weights = torch.tensor([1.0, 0.5, 2.0], dtype=torch.float64)
    expected = trl_normalize_then_sum(rewards, weights, group_size)
    assert_close(normalize_then_sum_advantages(rewards, weights, group_size), expected, rtol=1e-6, atol=1e-6)


def _rollout(rewards: dict[str, torch.Tensor], group_size: int) -> Rollout:
    n = next(iter(rewards.values())).numel()
    rollout = Rollout(
        prompt_ids=torch.zeros(n, 1, dtype=torch.long),
        prompt_mask=torch.ones(n, 1, dtype=torch.long),
        response_ids=torch.zeros(n, 1, dtype=torch.long),
        response_mask=torch.ones(n, 1),
        group_index=torch.arange(n) // group_size,
        group_size=group_size,
        truncated=torch.zeros(n, dtype=torch.bool),
    )
    rollout.rewards = rewards
    return rollout


def test_the_callback_weighs_by_the_reward_callbacks_or_its_own_weights():
    rewards = {
        "sort_inclusion_ordering": torch.tensor([1.0, 0.0, 1.0, 1.0]),
        "sort_distance": torch.tensor([0.0, 10, 5, 0]),
    }
    rollout = _rollout(rewards, group_size=2)
    trainer = SimpleNamespace(callbacks=[SortInclusionOrderingReward(weight=2.0), SortDistanceReward(weight=0.0)])
    module = SimpleNamespace(kl=None)
    callback = NormalizeThenSumAdvantage(eps=0.0)
    callback.setup(trainer, module, "fit")  # the reward callbacks' weights: only the first counts
    assert_close(callback.compute(rollout), torch.tensor([1.0, -1.0, 0.0, 0.0]) * math.sqrt(1.5))
    callback = NormalizeThenSumAdvantage(weights={"sort_inclusion_ordering": 1.0, "sort_distance": 1.0}, eps=0.0)
    callback.setup(trainer, module, "fit")
    assert_close(callback.compute(rollout), torch.tensor([0.0, 0.0, 1.0, -1.0]) * math.sqrt(1.5))
    with pytest.raises(ValueError, match=r"weights names \['length'\], not rewards of this run"):
        NormalizeThenSumAdvantage(weights={"length": 1.0}).setup(trainer, module, "fit")
    kl_reward = SimpleNamespace(kl=SimpleNamespace(mode="reward", coef=0.1))
    with pytest.raises(ValueError, match="kl.mode='reward'"):
        NormalizeThenSumAdvantage().setup(trainer, kl_reward, "fit")
    with pytest.raises(ValueError, match="needs group_size >= 2"):
        callback.check_group_size(1)

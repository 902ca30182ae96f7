"""W-REINFORCE's advantages (``WeightedReinforceAdvantage``; Zhu et al. 2025, arXiv:2506.01347) by hand and
against the authors' code restated (in a run: ``tests/modules/test_weighted_reinforce.py``)."""

from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.advantages import WeightedReinforceAdvantage
from rlvr_lightning.core.advantage_estimators import weighted_reinforce_advantages


def test_a_hand_computed_example():
    correct = torch.tensor([True, False, False, True])
    assert_close(weighted_reinforce_advantages(correct, 0.1), torch.tensor([0.1, -1.0, -1.0, 0.1]))
    assert_close(weighted_reinforce_advantages(correct, 1.0), torch.tensor([1.0, -1.0, -1.0, 1.0]))  # +-1
    assert_close(weighted_reinforce_advantages(correct, 0.0), torch.tensor([0.0, -1.0, -1.0, 0.0]))  # NSR


def _authors_weighted(token_level_scores, eos_mask, positive_advantage_weight, gamma=1.0):
    """RLVR-Decomposed a5d4e7c ``verl/trainer/ppo/core_algos.py`` (the ``psr_nsr`` estimator, ``advantage ==
    'weighted'``) restated; the 0/1 score on each response's last token, as the reward manager writes it."""
    token_level_rewards = token_level_scores
    returns = torch.zeros_like(token_level_rewards)
    running_return = 0
    correct_idx = token_level_scores.sum(-1) == 1
    incorrect_idx = token_level_scores.sum(-1) == 0
    for t in reversed(range(token_level_rewards.shape[1])):
        running_return = token_level_rewards[:, t] + gamma * running_return
        returns[:, t] = running_return
        running_return = running_return * eos_mask[:, t]
    advantages = returns.clone()
    advantages[correct_idx] *= positive_advantage_weight
    advantages[incorrect_idx] -= 1
    return advantages * eos_mask


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("weight", [0.1, 0.5, 1.0])
def test_equals_the_authors_code(seed, weight):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 7, (16,), generator=g)
    eos_mask = (torch.arange(6)[None, :] < lengths[:, None]).float()
    correct = torch.rand(16, generator=g) < 0.4
    scores = torch.zeros(16, 6)
    scores[torch.arange(16), lengths - 1] = correct.float()
    ours = weighted_reinforce_advantages(correct, weight)[:, None] * eos_mask
    assert_close(ours, _authors_weighted(scores, eos_mask, weight))


def test_a_graded_reward_counts_as_correct_from_a_threshold():
    rollout = SimpleNamespace(reward=torch.tensor([7.0, 5.0, 6.0, 3.0]), correct=None)
    by_threshold = WeightedReinforceAdvantage(positive_weight=0.2, correct_at=6.0)
    assert not by_threshold.reads_correctness and WeightedReinforceAdvantage().reads_correctness
    assert_close(by_threshold.compute(rollout), torch.tensor([0.2, -1.0, 0.2, -1.0]))
    with pytest.raises(ValueError, match="needs rollout.correct"):
        WeightedReinforceAdvantage().compute(rollout)

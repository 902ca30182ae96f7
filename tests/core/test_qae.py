"""QAE's quantile baseline (``GroupNormalizedAdvantage(quantile=K)``; Wu et al. 2025, arXiv:2509.22611) against a
hand example, the paper's closed form for 0/1 rewards (eq. 4), numpy's inverted-CDF quantile, and the authors' code
restated: verl's ``compute_grpo_outcome_advantage`` with the mean replaced by ``torch.quantile(scores, quantile_k)``,
as the QAE README (github.com/junkangwu/QAE) shows the change to ``verl/trainer/ppo/core_algos.py``."""

from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.advantages import GroupNormalizedAdvantage
from rlvr_lightning.core.advantage_estimators import group_quantiles, normalized_advantages


def test_a_hand_computed_group():
    # 5 of 8 correct; sorted 0 0 0 1 1 1 1 1. K = 0.4: the paper's quantile is the 4th value (ceil(3.2)), 1;
    # torch.quantile interpolates at rank 0.4 * 7 = 2.8, between the 3rd (0) and 4th (1) values: 0.8
    rewards = torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    std = (5 * 0.375**2 + 3 * 0.625**2) / 7  # the unbiased variance, 0.267857...
    std = std**0.5
    paper = normalized_advantages(rewards, 8, quantile=0.4)
    assert_close(paper, (rewards - 1.0) / (std + 1e-6))  # correct: 0, wrong: -1 / std
    code = normalized_advantages(rewards, 8, quantile=0.4, quantile_method="linear")
    assert_close(code, (rewards - 0.8) / (std + 1e-6))  # correct: +0.2 / std, wrong: -0.8 / std


@pytest.mark.parametrize("group_size", [8, 16])
@pytest.mark.parametrize("k", [0.25, 0.4, 0.6])
def test_binary_rewards_follow_the_papers_closed_form(group_size, k):
    # b_K = 0 if p <= 1 - K else 1, p the group's success rate (eq. 4): a hard prompt's wrong responses and an easy
    # prompt's correct ones get advantage 0
    for correct in range(group_size + 1):
        rewards = torch.zeros(1, group_size)
        rewards[0, :correct] = 1.0
        expected = 0.0 if correct / group_size <= 1 - k else 1.0
        assert group_quantiles(rewards, k).item() == expected, (correct, k)
        advantages = normalized_advantages(rewards, quantile=k)
        if 0 < correct < group_size:
            moved = rewards != expected  # only the responses on the far side of the baseline
            assert (advantages[moved] != 0).all() and (advantages[~moved] == 0).all()
        else:
            assert (advantages == 0).all()


@pytest.mark.parametrize("group_size", [2, 5, 8, 10, 16])
def test_the_papers_quantile_is_numpys_inverted_cdf(group_size):
    g = torch.Generator().manual_seed(group_size)
    rewards = torch.randint(0, 4, (64, group_size), generator=g).double() + torch.rand(64, 1, generator=g).double()
    for k in (0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.9):
        expected = np.quantile(rewards.numpy(), k, axis=1, method="inverted_cdf", keepdims=True)
        assert_close(group_quantiles(rewards, k), torch.from_numpy(expected), msg=str(k))


def _qae_code(rewards: torch.Tensor, index: list[int], quantile_k: float, epsilon: float = 1e-6) -> torch.Tensor:
    """verl 1dda039 ``compute_grpo_outcome_advantage`` (norm_adv_by_std_in_grpo=True) with QAE's change restated."""
    scores = rewards.clone()
    id2score, id2mean, id2std = defaultdict(list), {}, {}
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
    for idx in id2score:
        scores_tensor = torch.stack(id2score[idx])
        if 0 < quantile_k < 1:
            id2mean[idx] = torch.quantile(scores_tensor, quantile_k)
        else:
            id2mean[idx] = torch.mean(scores_tensor)
        id2std[idx] = torch.std(scores_tensor)
    for i in range(scores.shape[0]):
        scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
    return scores


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [0.4, 0.6])
def test_linear_equals_the_authors_code(seed, k):
    g = torch.Generator().manual_seed(seed)
    group_size, prompts = 8, 16
    rewards = torch.where(torch.rand(prompts * group_size, generator=g) < 0.5, 1.0, -1.0)  # verl DAPO's +-1
    rewards[: 2 * group_size] = torch.rand(2 * group_size, generator=g)  # and two groups of non-binary rewards
    rewards[2 * group_size : 3 * group_size] = 1.0  # and one all-correct group
    index = [i // group_size for i in range(rewards.numel())]
    ours = normalized_advantages(rewards, group_size, eps=1e-6, quantile=k, quantile_method="linear")
    assert_close(ours, _qae_code(rewards, index, k))


def test_the_callback_passes_its_options_and_refuses_bad_ones():
    rollout = SimpleNamespace(reward=torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]), group_size=4)
    assert_close(
        GroupNormalizedAdvantage(quantile=0.4, quantile_method="linear").compute(rollout),
        normalized_advantages(rollout.reward, 4, quantile=0.4, quantile_method="linear"),
    )
    assert not torch.equal(
        GroupNormalizedAdvantage(quantile=0.4).compute(rollout), GroupNormalizedAdvantage().compute(rollout)
    )
    with pytest.raises(ValueError, match=r"quantile=0.0 is not valid: must be a finite number in \(0, 1\)"):
        GroupNormalizedAdvantage(quantile=0.0)
    with pytest.raises(ValueError, match=r"quantile_method='nearest' is not valid; choose one of"):
        GroupNormalizedAdvantage(quantile=0.4, quantile_method="nearest")
    with pytest.raises(ValueError, match=r"the quantile must be in \(0, 1\)"):
        group_quantiles(torch.zeros(1, 4), 1.0)

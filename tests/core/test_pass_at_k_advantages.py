"""Pass@k training advantages: Chen et al. 2025's analytical form for 0/1 rewards (re-derived from the paper), an
enumeration of every k-subset for any rewards, and verl's grpo_passk restated line by line (1e-6, float64)."""

import itertools
import math
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.advantages import PassAtKAdvantage
from rlvr_lightning.core.pass_at_k import pass_at_k_advantages
from tests.core.verl_restated import verl_grpo_passk

F64 = dict(dtype=torch.float64)


def chen_binary(correct: int, n: int, k: int) -> tuple[float, float]:
    """Chen et al. 2025 (arXiv:2508.10751), the analytical advantages of a correct and a wrong response of a group
    of n with `correct` correct: mean = 1 - C(n_wrong, k)/C(n, k), std = sqrt(mean (1 - mean)),
    A_pos = (1 - mean)/std, A_neg = (1 - mean - C(n_wrong - 1, k - 1)/C(n - 1, k - 1))/std."""
    wrong = n - correct
    mean = 1 - math.comb(wrong, k) / math.comb(n, k)
    std = math.sqrt(mean * (1 - mean))
    if std == 0:  # fewer wrong responses than k: every draw holds a correct one
        return 0.0, 0.0
    return (1 - mean) / std, (1 - mean - math.comb(wrong - 1, k - 1) / math.comb(n - 1, k - 1)) / std


def test_hand_computed_group_of_four_pass_at_2():
    # 1 correct of 4, k = 2: P(a draw of 2 holds it) = 1/2 -> mean 1/2, std 1/2; correct (1 - 1/2)/(1/2) = 1;
    # wrong: the draws holding it hold the correct one with probability 1/3 -> (1/3 - 1/2)/(1/2) = -1/3
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0], **F64)
    assert_close(pass_at_k_advantages(rewards, 4, 2, eps=0.0), torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3], **F64))
    # verl's leave-one-out at k = n: only the best gets r_max - r_second = 1, over std (unbiased) 1/2
    assert_close(pass_at_k_advantages(rewards, 4, 4, "leave_one_out", eps=0.0), torch.tensor([2.0, 0, 0, 0], **F64))


@pytest.mark.parametrize("n, k", [(4, 2), (8, 3), (8, 4), (16, 5)])
def test_binary_rewards_give_chens_analytical_advantages(n, k):
    for correct in range(1, n):  # all-correct or all-wrong groups get 0
        rewards = torch.tensor([1.0] * correct + [0.0] * (n - correct), **F64)
        positive, negative = chen_binary(correct, n, k)
        expected = torch.tensor([positive] * correct + [negative] * (n - correct), **F64)
        assert_close(pass_at_k_advantages(rewards, n, k, eps=0.0), expected, rtol=1e-6, atol=1e-6)
    assert torch.count_nonzero(pass_at_k_advantages(torch.ones(n, **F64), n, k)) == 0


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_any_rewards_match_an_enumeration_of_every_draw(k):
    generator = torch.Generator().manual_seed(k)
    n = 6
    rewards = torch.randint(0, 4, (3, n), generator=generator).double()  # ties included
    expected = []
    for group in rewards.tolist():
        draws = [max(group[j] for j in s) for s in itertools.combinations(range(n), k)]
        mean, std = sum(draws) / len(draws), torch.tensor(draws, **F64).std(unbiased=False).item()
        for i in range(n):
            holding = [max(group[j] for j in s) for s in itertools.combinations(range(n), k) if i in s]
            expected.append(0.0 if std == 0 else (sum(holding) / len(holding) - mean) / std)
    got = pass_at_k_advantages(rewards.reshape(-1), n, k, eps=0.0)
    assert_close(got, torch.tensor(expected, **F64), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_leave_one_out_at_the_group_size_matches_verls_grpo_passk(seed):
    generator = torch.Generator().manual_seed(seed)
    group_size, groups = 5, 6
    scores = torch.rand(groups * group_size, generator=generator, **F64)
    scores[:group_size] = 0.5  # a group whose rewards agree
    index = [f"uid{i // group_size}" for i in range(groups * group_size)]
    expected = verl_grpo_passk(scores, index)
    got = pass_at_k_advantages(scores, group_size, group_size, "leave_one_out")
    assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_the_callback_checks_k_against_the_group_size():
    rollout = SimpleNamespace(reward=torch.tensor([1.0, 0.0, 0.0, 0.0]), group_size=4)
    assert_close(PassAtKAdvantage(k=2).compute(rollout), torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]), atol=1e-5, rtol=0)
    PassAtKAdvantage(k=None, baseline="leave_one_out").check_group_size(8)
    with pytest.raises(ValueError, match=r"baseline='mean' need 1 <= k <= 7, got k=8"):
        PassAtKAdvantage(k=None).check_group_size(8)
    with pytest.raises(ValueError, match=r"baseline='max' is not valid"):
        PassAtKAdvantage(baseline="max")
    with pytest.raises(ValueError, match=r"k=0 is not valid"):
        PassAtKAdvantage(k=0)

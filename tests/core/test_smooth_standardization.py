"""DCPO's smooth advantage standardization (arXiv:2509.02333): by hand over three visits of one prompt,
and equal to the authors' `compute_dcpo_outcome_advantage` with their trainer's per-prompt store, restated, over
random runs in which prompts come back."""

import math
import random
from collections import defaultdict

import pytest
import torch

from rlvr_lightning.core.smooth_standardization import (
    PromptRewardStats,
    pooled_stats,
    smooth_standardized_advantages,
)


def fresh(groups: int) -> PromptRewardStats:
    zeros = torch.zeros(groups, dtype=torch.float64)
    return PromptRewardStats(zeros, zeros, torch.zeros(groups, dtype=torch.long))


def test_three_visits_of_one_prompt_by_hand():
    # visit 1, rewards 1 0 0 0: mean 1/4, unbiased std 1/2: GRPO's advantages
    first, stats = smooth_standardized_advantages(torch.tensor([1.0, 0, 0, 0], dtype=torch.float64), 4, fresh(1))
    assert first.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5])
    assert (stats.mean.item(), stats.std.item(), stats.visits.item()) == pytest.approx((0.25, 0.5, 1))
    # visit 2, all 0: the step's std is 0 (A_new = 0); pooled mean 1/8, var (1/4 + 0 + 1/2 * 1/16) / 2 = 9/64
    second, stats = smooth_standardized_advantages(torch.zeros(4, dtype=torch.float64), 4, stats)
    assert (stats.mean.item(), stats.std.item()) == pytest.approx((0.125, 0.375))
    # A_total = -1/8 / 3/8 = -1/3; SA_new = SA_total = 1/2 (0) + 1/2 (-1/3) = -1/6
    assert second.tolist() == pytest.approx([-1 / 6] * 4)
    # visit 3, 1 1 0 0: step mean 1/2, std sqrt(1/3), A_new = +-sqrt(3)/2;
    # pooled mean (2/8 + 1/2) / 3 = 1/4, var (2 * 9/64 + 1/3 + 2/3 * 9/64) / 3 = 17/72
    third, stats = smooth_standardized_advantages(torch.tensor([1.0, 1, 0, 0], dtype=torch.float64), 4, stats)
    total_std = math.sqrt(17 / 72)
    assert (stats.mean.item(), stats.std.item(), stats.visits.item()) == pytest.approx((0.25, total_std, 3))
    a_new, up, down = math.sqrt(3) / 2, 0.75 / total_std, -0.25 / total_std
    # r = 1: SA_new = 2/3 a_new + 1/3 up (1.092) < SA_total = 1/3 a_new + 2/3 up (1.318): SA_new
    # r = 0: SA_new = -2/3 a_new + 1/3 down (-0.749), SA_total = -1/3 a_new + 2/3 down (-0.632): SA_total
    expected_up, expected_down = 2 / 3 * a_new + up / 3, -a_new / 3 + 2 / 3 * down
    assert third.tolist() == pytest.approx([expected_up, expected_up, expected_down, expected_down])


def test_without_the_std_the_differences_are_smoothed():
    rewards = torch.tensor([3.0, 1.0], dtype=torch.float64)
    prior = PromptRewardStats(torch.tensor([0.0], dtype=torch.float64), torch.tensor([1.0]), torch.tensor([1]))
    advantages, stats = smooth_standardized_advantages(rewards, 2, prior, scale_by_std=False)
    # step mean 2, pooled mean 1: A_new = +-1, A_total = 2, 0; w = 1/2: both mixes 1.5 and -0.5 / 0.5
    assert stats.mean.item() == pytest.approx(1.0)
    assert advantages.tolist() == pytest.approx([1.5, -0.5])


def test_pooling_one_group_at_a_time_equals_the_statistics_of_equal_groups():
    groups = torch.randn(5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    stats = fresh(1)
    for group in groups:
        stats = pooled_stats(stats, group.mean().view(1), group.std().view(1))
    # the mean of the means, and the mean of the variances plus the (population) variance of the means
    expected_var = groups.var(dim=1).mean() + groups.mean(dim=1).var(unbiased=False)
    assert stats.mean.item() == pytest.approx(groups.mean().item())
    assert stats.std.item() ** 2 == pytest.approx(expected_var.item())


def authors_advantages(scores, index, store, norm_adv_by_std_in_grpo=True):
    """`compute_dcpo_outcome_advantage` and `get_mean_std` of github.com/lime-RL/DCPO (verl/trainer/ppo/core_algos.py),
    with the trainer's store (`old_mean_std`, recipe/dcpo/src/dcpo_ray_trainer.py) read before and written after."""
    scores = scores.clone()
    id2score, id2mean, id2std, id2times, id2mean_new, id2std_new = defaultdict(list), {}, {}, {}, {}, {}
    for i in range(len(scores)):
        id2score[index[i]].append(scores[i])
        old = store.get(index[i], {"mean": 0.0, "std": 0.0, "times": 0})
        id2mean[index[i]], id2std[index[i]], id2times[index[i]] = old["mean"], old["std"], old["times"]
    for idx in id2score:
        new_mean, new_std = torch.mean(torch.tensor(id2score[idx])), torch.std(torch.tensor(id2score[idx]))
        id2mean_new[idx], id2std_new[idx] = new_mean, new_std
        old_times, times = id2times[idx], id2times[idx] + 1
        if old_times == 0:
            id2mean[idx], id2std[idx] = new_mean, new_std
        else:
            old_mean, old_std = id2mean[idx], id2std[idx]
            mean = (old_mean * old_times + new_mean) / (old_times + 1)
            var = old_times * (old_std**2) + (new_std**2) + old_times / times * (new_mean - old_mean) ** 2
            id2mean[idx], id2std[idx] = mean, math.sqrt(float(var / times))
    for i in range(len(scores)):
        idx = index[i]
        new, old = torch.tensor(0.0), torch.tensor(0.0)
        if norm_adv_by_std_in_grpo:
            if id2std_new[idx] > 0:
                new = (scores[i] - id2mean_new[idx]) / id2std_new[idx]
            if id2std[idx] > 0:
                old = (scores[i] - id2mean[idx]) / id2std[idx]
        else:
            new, old = scores[i] - id2mean_new[idx], scores[i] - id2mean[idx]
        s1 = 1 / (id2times[idx] + 1) * old + (1 - 1 / (id2times[idx] + 1)) * new
        s2 = 1 / (id2times[idx] + 1) * new + (1 - 1 / (id2times[idx] + 1)) * old
        scores[i] = torch.where(abs(s1) < abs(s2), s1, s2)
    for idx in id2score:
        store[idx] = {"mean": float(id2mean[idx]), "std": float(id2std[idx]), "times": id2times[idx] + 1}
    return scores


@pytest.mark.parametrize("scale_by_std", [True, False])
def test_equals_the_authors_code_over_runs_where_prompts_come_back(scale_by_std):
    rng = random.Random(0)
    for run in range(20):
        group_size, pool = rng.choice([2, 4, 8]), rng.randint(3, 12)
        store, stats = {}, {}
        for _ in range(10):
            prompts = rng.sample(range(pool), rng.randint(1, min(pool, 6)))  # distinct within a step
            binary = run % 2 == 0  # 0/1 rewards (many groups agree) or continuous ones
            draw = (lambda: float(rng.random() < 0.5)) if binary else (lambda: rng.uniform(-1, 2))
            rewards = torch.tensor([draw() for _ in prompts for _ in range(group_size)])
            index = [p for p in prompts for _ in range(group_size)]
            expected = authors_advantages(rewards, index, store, scale_by_std)
            known = [stats.get(p, (0.0, 0.0, 0)) for p in prompts]
            prior = PromptRewardStats(*(torch.tensor(c, dtype=torch.float64) for c in zip(*known, strict=True)))
            ours, after = smooth_standardized_advantages(rewards.double(), group_size, prior, scale_by_std)
            assert torch.allclose(ours.float(), expected, atol=1e-5), (run, ours, expected)
            for k, p in enumerate(prompts):
                stats[p] = (after.mean[k].item(), after.std[k].item(), int(after.visits[k]))
                assert stats[p][0] == pytest.approx(store[p]["mean"], abs=1e-6)
                assert stats[p][1] == pytest.approx(store[p]["std"], abs=1e-6)
                assert stats[p][2] == store[p]["times"]


def test_rewards_that_do_not_split_into_groups_are_refused():
    with pytest.raises(ValueError, match="do not split into groups of 4"):
        smooth_standardized_advantages(torch.zeros(6), 4, fresh(1))

"""GFPO's group filter (arXiv:2508.09726 sec. 3): the metrics and the kept rows, by hand; PODS' max-variance
down-sampling (arXiv:2504.13818) by hand and against every subset."""

from __future__ import annotations

import itertools

import pytest
import torch

from rlvr_lightning.core.group_filter import group_filter_rows, group_filter_scores, max_variance_rows

REWARDS = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 2.0, 2.0, 0.0])
LENGTHS = torch.tensor([5.0, 2.0, 7.0, 2.0, 3.0, 4.0, 8.0, 0.0])


def test_length_keeps_the_shortest_of_each_group_in_row_order():
    scores = group_filter_scores(REWARDS, LENGTHS, "length")
    # group 0: lengths 5, 2, 7, 2 -> rows 1 and 3; group 1: 3, 4, 8, 0 -> rows 7 (0 tokens) and 4 (3), in row order
    assert group_filter_rows(scores, group_size=4, keep=2).tolist() == [1, 3, 4, 7]
    assert group_filter_rows(scores, group_size=4, keep=3).tolist() == [0, 1, 3, 4, 5, 7]


def test_token_efficiency_keeps_the_most_reward_per_token():
    scores = group_filter_scores(REWARDS, LENGTHS, "token_efficiency")
    # group 0: 1/5, 0/2, 1/7, 1/2; group 1: 0/3, 2/4, 2/8, 0/1 (an empty response counts one token)
    assert scores.tolist() == pytest.approx([0.2, 0.0, 1 / 7, 0.5, 0.0, 0.5, 0.25, 0.0])
    assert group_filter_rows(scores, group_size=4, keep=2).tolist() == [0, 3, 5, 6]
    assert group_filter_rows(scores, group_size=4, keep=1).tolist() == [3, 5]


def test_first_keeps_the_rows_sampled_first():
    scores = group_filter_scores(REWARDS, LENGTHS, "first")
    assert group_filter_rows(scores, group_size=4, keep=3).tolist() == [0, 1, 2, 4, 5, 6]


def test_equal_scores_keep_the_earlier_rows():
    scores = group_filter_scores(torch.zeros(6), torch.full((6,), 4.0), "token_efficiency")
    assert group_filter_rows(scores, group_size=3, keep=2).tolist() == [0, 1, 3, 4]
    assert group_filter_rows(scores, group_size=3, keep=3).tolist() == list(range(6))


def test_bad_arguments_name_what_is_wrong():
    with pytest.raises(ValueError, match="metric='longest'.*length, token_efficiency, first, max_variance"):
        group_filter_scores(REWARDS, LENGTHS, "longest")
    with pytest.raises(ValueError, match="cannot keep 5 of each group of 4"):
        group_filter_rows(LENGTHS, group_size=4, keep=5)
    with pytest.raises(ValueError, match="cannot keep 2 of each group of 3 among 8 rows"):
        group_filter_rows(LENGTHS, group_size=3, keep=2)


def trl_gfpo_rows(scores, group_size, keep):
    """TRL's `GFPOTrainer` selection (huggingface/trl 43c338ae0, trl/experimental/gfpo/gfpo_trainer.py) restated:
    `torch.topk` of each group's scores, plus the group's first row."""
    _, local = torch.topk(scores.view(-1, group_size), keep, dim=-1)
    offsets = torch.arange(0, scores.numel(), group_size).unsqueeze(1)
    return (offsets + local).flatten()


@pytest.mark.parametrize("metric", ["length", "token_efficiency"])
def test_the_kept_rows_are_trls_on_random_groups(metric):
    generator = torch.Generator().manual_seed(0)
    for _ in range(100):
        rewards = torch.rand(6 * 16, generator=generator, dtype=torch.float64)
        lengths = torch.randperm(6 * 16, generator=generator).double() + 1  # distinct: no ties to break
        scores = group_filter_scores(rewards, lengths, metric)
        ours = group_filter_rows(scores, group_size=16, keep=5)
        assert torch.equal(ours, trl_gfpo_rows(scores, 16, 5).view(-1, 5).sort(dim=1).values.flatten())


def test_max_variance_keeps_the_most_varied_rewards_by_hand():
    # group 0: ones at rows 0, 3, 4, 5, 7, zeros at 1, 2, 6 -> two of each (variance 1/4): the zeros the stable
    # sort puts first (1, 2) and the ones it puts last (5, 7); group 1: 0..7 -> {0, 1, 7} and {0, 6, 7} vary alike,
    # the one with fewer high rewards is kept
    rewards = torch.tensor([1.0, 0, 0, 1, 1, 1, 0, 1] + list(range(8)), dtype=torch.float32)
    assert max_variance_rows(rewards, 8, 4).tolist() == [1, 2, 5, 7, 8, 9, 14, 15]
    assert max_variance_rows(rewards, 8, 3).tolist() == [1, 2, 7, 8, 9, 15]
    assert max_variance_rows(rewards, 8, 1).tolist() == [1, 8]  # one row: every variance is 0, the lowest kept
    assert max_variance_rows(rewards, 8, 8).tolist() == list(range(16))
    with pytest.raises(ValueError, match="cannot keep 9 of each group of 8"):
        max_variance_rows(rewards, 8, 9)
    with pytest.raises(ValueError, match="use max_variance_rows"):
        group_filter_scores(rewards, rewards, "max_variance")


def test_max_variance_reaches_the_largest_variance_of_any_subset():
    """PODS' Lemma: some `i` highest with the `keep - i` lowest vary the most; checked against every subset."""
    generator = torch.Generator().manual_seed(0)
    for trial in range(300):
        group, keep = 6, 1 + trial % 6
        levels = [0.0, 1.0] if trial % 3 == 0 else [0.0, 0.1, 0.5, 1.0, 1.1]
        rewards = torch.tensor(levels)[torch.randint(len(levels), (group,), generator=generator)]
        rows = max_variance_rows(rewards, group, keep).tolist()
        assert len(rows) == keep and rows == sorted(set(rows))
        best = max(rewards[list(s)].double().var(unbiased=False).item() for s in itertools.combinations(range(6), keep))
        assert rewards[rows].double().var(unbiased=False).item() == pytest.approx(best, abs=1e-12), (rewards, keep)

"""MAPO's mixed advantage (``MixedAdvantage``; Huang et al. 2025, arXiv:2509.18849) against a hand example and the
authors' code restated: ``grpomixpro`` in github.com/WenkeHuang/MAPO ``code/verl/trainer/ray_trainer.py``, GRPO's
``(r - mean) / (std + eps)`` and ``(r - mean) / (mean + eps)`` weighted by ``4 p (1 - p)`` and ``1 - 4 p (1 - p)``,
p the share of the group's scores equal to 1."""

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.advantages import MixedAdvantage
from rlvr_lightning.core.advantage_estimators import mixed_advantages


def test_a_hand_computed_batch():
    rewards = torch.tensor([[1.0] + [0.0] * 7, [1.0] * 7 + [0.0], [1.0] * 4 + [0.0] * 4, [0.0] * 8])
    advantages = mixed_advantages(rewards, rewards.bool())
    # 1 of 8 right: mean 1/8, unbiased std sqrt(1/8) = 0.35355; lambda = 1 - 4 (1/8)(7/8) = 0.5625
    std = 0.125**0.5
    right = 0.4375 * 0.875 / std + 0.5625 * 0.875 / 0.125  # 1.0828 + 3.9375 = 5.0203
    wrong = 0.4375 * -0.125 / std + 0.5625 * -1.0  # -0.1547 - 0.5625 = -0.7172
    assert_close(advantages[0], torch.tensor([right] + [wrong] * 7), atol=1e-5, rtol=1e-5)
    assert advantages[0, 0].item() == pytest.approx(5.0203, abs=1e-4)
    # 7 of 8 right: mean 7/8, the same std and lambda; percent deviations 0.125 / 0.875 and -1
    right = 0.4375 * 0.125 / std + 0.5625 * 0.125 / 0.875
    wrong = 0.4375 * -0.875 / std + 0.5625 * -1.0
    assert_close(advantages[1], torch.tensor([right] * 7 + [wrong]), atol=1e-5, rtol=1e-5)
    # 4 of 8: lambda 0, GRPO's advantage; all wrong: 0
    assert_close(advantages[2], torch.tensor([1.0] * 4 + [-1.0] * 4) * 0.5 / (8 * 0.25 / 7) ** 0.5, atol=1e-5, rtol=0)
    assert (advantages[3] == 0).all()


def test_certainty_comes_from_correctness_not_from_the_reward():
    # a 0.1 format bonus on every response: the mean moves, p does not
    correct = torch.tensor([True] + [False] * 7)
    advantages = mixed_advantages(correct.float() + 0.1, correct, 8)
    mean, std, weight = 0.225, 0.125**0.5, 0.5625
    assert advantages[0].item() == pytest.approx(0.4375 * 0.875 / std + weight * 0.875 / mean, rel=1e-5)


def _authors(scores: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """The authors' ``grpomixpro``, restated: per group (index), the std-normalised and the mean-normalised scores,
    mixed by the share of scores equal to 1."""
    index = [i // group_size for i in range(len(scores))]
    by_group = defaultdict(list)
    for i, score in enumerate(scores):
        by_group[index[i]].append(score)
    mean = {g: torch.mean(torch.tensor(v)) for g, v in by_group.items()}
    std = {g: torch.std(torch.tensor(v)) for g, v in by_group.items()}
    ones = {g: torch.sum(torch.tensor(v) == 1.0) for g, v in by_group.items()}
    out = torch.empty_like(scores)
    for i in range(len(scores)):
        g = index[i]
        p = ones[g] / group_size
        weight_std = 4 * p * (1 - p)
        by_std = (scores[i] - mean[g]) / (std[g] + eps)
        by_mean = (scores[i] - mean[g]) / (mean[g] + eps)
        out[i] = weight_std * by_std + (1 - weight_std) * by_mean
    return out


@pytest.mark.parametrize("group_size", [2, 5, 8, 16])
def test_equals_the_authors_code_on_random_batches(group_size):
    g = torch.Generator().manual_seed(group_size)
    for _ in range(100):
        prompts = int(torch.randint(1, 6, (1,), generator=g))
        rate = torch.rand(prompts, 1, generator=g)  # some groups all right or all wrong
        scores = (torch.rand(prompts, group_size, generator=g) < rate.round() * 0.5 + rate * 0.5).float().flatten()
        ours = mixed_advantages(scores, scores == 1.0, group_size)
        assert_close(ours, _authors(scores, group_size), atol=1e-5, rtol=1e-5)


def test_the_callback_reads_correctness_or_a_threshold():
    rewards = torch.tensor([1.1, 0.1, 0.1, 0.1])
    correct = torch.tensor([True, False, False, False])
    rollout = SimpleNamespace(reward=rewards, correct=correct, group_size=4)
    expected = mixed_advantages(rewards, correct, 4)
    assert MixedAdvantage().reads_correctness
    assert_close(MixedAdvantage().compute(rollout), expected)
    by_threshold = MixedAdvantage(correct_at=1.0)
    assert not by_threshold.reads_correctness
    assert_close(by_threshold.compute(SimpleNamespace(reward=rewards, correct=None, group_size=4)), expected)
    with pytest.raises(ValueError, match="rollout.correct"):
        MixedAdvantage().compute(SimpleNamespace(reward=rewards, correct=None, group_size=4))
    with pytest.raises(ValueError, match="eps"):
        MixedAdvantage(eps=-1.0)

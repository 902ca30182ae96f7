"""AsymRE's shifted baseline (``CenteredAdvantage(baseline_shift=dV)``; Arnal et al. 2025, arXiv:2506.20520)
against a hand example and Trinity-RFT's ``ASYMREGroupAdvantage`` restated."""

import math
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.advantages import CenteredAdvantage
from rlvr_lightning.core.advantage_estimators import centered_advantages, length_weighted_centered_advantages


def test_a_hand_computed_example():
    # delta V = -0.1. Groups of 4: [1, -1, -1, 1] mean 0, baseline -0.1: A = r + 0.1; [1, -1, 1, 1] mean 0.5,
    # baseline 0.4: A = r - 0.4; [1, 1, 1, 1] (no signal under GRPO) mean 1, baseline 0.9: A = 0.1
    rewards = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, -1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    expected = torch.tensor([1.1, -0.9, -0.9, 1.1, 0.6, -1.4, 0.6, 0.6, 0.1, 0.1, 0.1, 0.1])
    assert_close(centered_advantages(rewards, 4, baseline_shift=-0.1), expected)
    assert_close(centered_advantages(rewards, 4, baseline_shift=0.0), centered_advantages(rewards, 4))


def _trinity_asymre(rewards: list[list[float]], baseline_shift: float) -> list[list[float]]:
    """Trinity-RFT d4baca6 ``trinity/algorithm/advantage_fn/asymre_advantage.py`` ``ASYMREGroupAdvantage
    .calculate_group_advantage`` restated, for groups of two or more."""
    out = []
    for group in rewards:
        group_rewards = torch.tensor(group, dtype=torch.float32)
        group_baseline = torch.mean(group_rewards) + baseline_shift
        out.append([float(reward - group_baseline) for reward in group])
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("shift", [-0.1, -0.5, 0.3])
def test_equals_trinitys_asymre_advantage(seed, shift):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.where(torch.rand(6, 8, generator=g) < 0.4, 1.0, -1.0)
    rewards[0] = torch.rand(8, generator=g)  # one group of non-binary rewards
    rollout = SimpleNamespace(reward=rewards.flatten(), group_size=8)
    ours = CenteredAdvantage(baseline_shift=shift).compute(rollout)
    assert_close(ours, torch.tensor(_trinity_asymre(rewards.tolist(), shift)).flatten())


def test_the_shift_composes_with_the_other_options():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    rollout = SimpleNamespace(reward=rewards, group_size=2, response_mask=mask)
    weighted = CenteredAdvantage(baseline="length_weighted", baseline_shift=-0.2).compute(rollout)
    assert_close(weighted, length_weighted_centered_advantages(rewards, mask.sum(-1), 2) + 0.2)
    # GPG's alpha scales the shifted advantages: one of two groups differs -> 2
    scaled = CenteredAdvantage(baseline_shift=-0.2, scale_by_valid_groups=True).compute(rollout)
    assert_close(scaled, 2 * (centered_advantages(rewards, 2) + 0.2))
    with pytest.raises(ValueError, match=r"baseline_shift=nan is not valid: must be a finite number"):
        CenteredAdvantage(baseline_shift=math.nan)

"""GPG's alpha (``scale_by_valid_groups``) against a hand example and the GPG code's loss, restated."""

from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.advantages import CenteredAdvantage, GroupNormalizedAdvantage
from rlvr_lightning.core.advantage_estimators import valid_group_scale
from rlvr_lightning.core.aggregation import aggregate_loss
from rlvr_lightning.core.losses.policy_losses import PolicyGradient


def test_valid_group_scale_is_the_inverse_share_of_responses_in_groups_that_differ():
    # groups [1, 0], [1, 1], [0, 0], [0.5, 1.5]: two of four differ -> 8 responses / 4 valid = 2
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.5, 1.5])
    assert valid_group_scale(rewards, 2).item() == pytest.approx(2.0)
    assert valid_group_scale(rewards[:2], 2).item() == pytest.approx(1.0)  # every group differs
    assert valid_group_scale(torch.ones(6), 3).item() == pytest.approx(1.0)  # none does: no signal, no scale
    # groups of 3: [0, 0, 1] differs, [2, 2, 2] does not -> 6 / 3 = 2
    assert valid_group_scale(torch.tensor([0.0, 0.0, 1.0, 2.0, 2.0, 2.0]), 3).item() == pytest.approx(2.0)


def test_scale_by_valid_groups_multiplies_either_estimator():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    rollout = SimpleNamespace(reward=rewards, group_size=2, response_mask=torch.ones(8, 3))
    # valid groups: the first and the third of four -> alpha = 2
    assert_close(
        CenteredAdvantage(scale_by_valid_groups=True).compute(rollout),
        2 * torch.tensor([0.5, -0.5, 0.0, 0.0, 0.5, -0.5, 0.0, 0.0]),
    )
    plain = GroupNormalizedAdvantage().compute(rollout)
    assert_close(GroupNormalizedAdvantage(scale_by_valid_groups=True).compute(rollout), 2 * plain)
    assert_close(CenteredAdvantage().compute(rollout), torch.tensor([0.5, -0.5, 0.0, 0.0, 0.5, -0.5, 0.0, 0.0]))


def _gpg_loss(rewards, log_probs, mask, group_size, scale_rewards):
    """The GPG code's loss (AMAP-ML/GPG e096da8, open-r1/src/open_r1/gpg_trainer.py, ``adjust_gd=True``) restated:
    advantages ``r - mean`` (``/ (std + 1e-4)`` with ``scale_rewards``), ``-logp * A`` summed over the batch's
    tokens and divided by their number, then divided by ``inverse_alpha``, the share of groups with std > 0."""
    grouped = rewards.view(-1, group_size)
    stds = grouped.std(dim=1)
    inverse_alpha = min(1.0, (stds.numel() - (stds == 0).sum().item()) / stds.numel())
    advantages = rewards - grouped.mean(dim=1).repeat_interleave(group_size)
    if scale_rewards:
        advantages = advantages / (stds.repeat_interleave(group_size) + 1e-4)
    per_token_loss = -log_probs * advantages.unsqueeze(1)
    return (per_token_loss * mask).sum() / mask.sum() / inverse_alpha


@pytest.mark.parametrize("scale_rewards", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_gpg_equals_the_gpg_code(seed, scale_rewards):
    generator = torch.Generator().manual_seed(seed)
    group_size, groups = 4, 5
    rewards = torch.randint(0, 2, (groups * group_size,), generator=generator).double()
    rewards[:group_size] = 1.0  # at least one group whose rewards all agree
    log_probs = torch.randn(groups * group_size, 6, generator=generator, dtype=torch.float64).requires_grad_()
    lengths = torch.randint(1, 7, (groups * group_size,), generator=generator)
    mask = (torch.arange(6) < lengths[:, None]).double()
    rollout = SimpleNamespace(reward=rewards, group_size=group_size, response_mask=mask)
    estimator = (
        GroupNormalizedAdvantage(eps=1e-4, scale_by_valid_groups=True)
        if scale_rewards
        else CenteredAdvantage(scale_by_valid_groups=True)
    )
    advantages = estimator.compute(rollout)
    ours = aggregate_loss(PolicyGradient()(log_probs, None, advantages, mask).loss, mask, "token-mean")
    theirs = _gpg_loss(rewards, log_probs, mask, group_size, scale_rewards)
    assert_close(ours, theirs)
    assert_close(torch.autograd.grad(ours, log_probs)[0], torch.autograd.grad(theirs, log_probs)[0])

import math

import pytest
import torch

from rlvr_lightning.core.importance_sampling import ROLLOUT_IS_MODES, mismatch_stats, rollout_is_weights

# trainer - sampler log-ratios: row 0 = [0.5, -1.0], row 1 = [0.2, (masked) 3.0]
TRAINER = torch.tensor([[-1.0, -2.0], [-0.8, -0.5]])
SAMPLER = torch.tensor([[-1.5, -1.0], [-1.0, -3.5]])
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])


def test_token_truncate_caps_each_ratio():
    weights = rollout_is_weights(TRAINER, SAMPLER, MASK, "token_truncate", max_weight=1.5)
    expected = torch.tensor([[1.5, math.exp(-1.0)], [math.exp(0.2), 1.0]])  # e^0.5 = 1.65 -> 1.5; masked -> 1
    torch.testing.assert_close(weights, expected)


def test_token_truncate_with_a_floor():
    weights = rollout_is_weights(TRAINER, SAMPLER, MASK, "token_truncate", max_weight=1.5, min_weight=0.5)
    torch.testing.assert_close(weights[0], torch.tensor([1.5, 0.5]))  # e^-1 = 0.37 -> 0.5


def test_token_mask_zeroes_ratios_outside_the_band():
    weights = rollout_is_weights(TRAINER, SAMPLER, MASK, "token_mask", max_weight=1.5, min_weight=0.5)
    torch.testing.assert_close(weights, torch.tensor([[0.0, 0.0], [math.exp(0.2), 1.0]]))


def test_sequence_modes_use_the_product_over_real_tokens():
    # row 0: 0.5 - 1.0 = -0.5 -> e^-0.5; row 1: 0.2 (the masked 3.0 is left out) -> e^0.2
    truncated = rollout_is_weights(TRAINER, SAMPLER, MASK, "sequence_truncate", max_weight=1.1)
    torch.testing.assert_close(truncated, torch.tensor([[math.exp(-0.5)], [1.1]]))
    masked = rollout_is_weights(TRAINER, SAMPLER, MASK, "sequence_mask", max_weight=1.1)
    torch.testing.assert_close(masked, torch.tensor([[math.exp(-0.5)], [0.0]]))


def test_weights_carry_no_gradient_and_survive_huge_log_ratios():
    trainer = torch.tensor([[0.0, -500.0]], requires_grad=True)
    sampler = torch.tensor([[-500.0, 0.0]])
    weights = rollout_is_weights(trainer, sampler, None, "token_truncate", max_weight=2.0)
    assert not weights.requires_grad
    assert torch.isfinite(weights).all()
    torch.testing.assert_close(weights, torch.tensor([[2.0, math.exp(-20.0)]]))


def test_equal_log_probs_give_weight_one_in_every_mode():
    for mode in ROLLOUT_IS_MODES:
        weights = rollout_is_weights(TRAINER, TRAINER.clone(), MASK, mode, max_weight=2.0)
        assert torch.equal(weights, torch.ones_like(weights)), mode


def test_invalid_mode_and_band_name_the_option():
    with pytest.raises(ValueError, match="rollout_is='token'.*token_truncate"):
        rollout_is_weights(TRAINER, SAMPLER, MASK, "token")
    with pytest.raises(ValueError, match="rollout_is_min < rollout_is_max"):
        rollout_is_weights(TRAINER, SAMPLER, MASK, "token_mask", max_weight=1.0, min_weight=2.0)


def test_mismatch_stats_by_hand():
    stats = mismatch_stats(TRAINER, SAMPLER, MASK, max_weight=1.5)
    # real tokens' log-ratios d = [0.5, -1.0, 0.2]
    d = torch.tensor([0.5, -1.0, 0.2])
    torch.testing.assert_close(stats["abs_diff_mean"], d.abs().mean())
    torch.testing.assert_close(stats["abs_diff_max"], torch.tensor(1.0))
    # k3 of KL(sampler || trainer) per token: e^d - d - 1
    torch.testing.assert_close(stats["k3_kl"], (d.exp() - d - 1).mean())
    torch.testing.assert_close(stats["is_weight_mean"], d.exp().mean())
    torch.testing.assert_close(stats["is_weight_max"], torch.tensor(math.exp(0.5)))
    torch.testing.assert_close(stats["capped_fraction"], torch.tensor(1 / 3))  # only e^0.5 > 1.5


def test_off_policy_sequences_with_a_negative_advantage_and_a_large_divergence_leave_the_loss():
    from rlvr_lightning.core.importance_sampling import mask_off_policy_sequences
    from rlvr_lightning.core.losses.policy_losses import PPOClip

    log_probs = torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]], requires_grad=True)
    # mean log(pi_sampler / pi_theta): row 0 (0.4 + 0.8) / 2 = 0.6 > 0.5; row 1 0.2; row 2 1.0 but A > 0
    sampler = torch.tensor([[-0.6, -0.2], [-0.8, -9.0], [0.0, 0.0]])
    mask = torch.tensor([[True, True], [True, False], [True, True]])
    advantages = torch.tensor([-1.0, -1.0, 1.0])
    out = mask_off_policy_sequences(
        PPOClip()(log_probs, None, advantages, mask), advantages, log_probs, sampler, mask, 0.5
    )
    torch.testing.assert_close(out.loss, torch.tensor([[0.0, 0.0], [1.0, 0.0], [-1.0, -1.0]]))
    out.loss.sum().backward()
    torch.testing.assert_close(log_probs.grad, torch.tensor([[0.0, 0.0], [1.0, 0.0], [-1.0, -1.0]]))
    torch.testing.assert_close(out.stats["off_policy_masked_frac"], torch.tensor(1 / 3))
    # no sampler's log-probs: the policy sampled them itself, nothing leaves
    out = mask_off_policy_sequences(
        PPOClip()(log_probs, None, advantages, mask), advantages, log_probs, None, mask, 0.0
    )
    assert out.stats["off_policy_masked_frac"] == 0

"""`aggregation: {mode: delta-l}` in the update: micro-batches add up to their mini-batch (each reads the
mini-batch's sum of |o_i|^-alpha), and alpha reaches the loss."""

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.aggregation import length_powers
from rlvr_lightning.core.losses import policy_losses
from rlvr_lightning.modules.aggregation_options import AggregationConfig
from rlvr_lightning.modules.options import UpdateConfig
from rlvr_lightning.modules.update.normalisers import mini_batch_sizes
from rlvr_lightning.modules.update.policy_update import PolicyUpdate
from tests.modules import test_packed_update as packed
from tests.modules.test_packed_update import MINI_BATCH, _assert_same_update, _options, _rollout, _run

models, tokenizer_dir = packed.models, packed.tokenizer_dir  # the fixtures, by name

WHOLE = UpdateConfig(mini_batch_size=MINI_BATCH, max_grad_norm=None)
MICRO = UpdateConfig(mini_batch_size=MINI_BATCH, micro_batch_size=1, max_grad_norm=None)


def _delta_l(policy, reference, update, alpha):
    options = _options(policy, reference, policy_losses.PPOClip(), "delta-l", update)
    return {**options, "aggregation": AggregationConfig(mode="delta-l", alpha=alpha)}


def test_micro_batches_train_as_their_mini_batch(models):
    policy, reference, _ = models
    rollout = _rollout(policy)
    runs = [_run(PolicyUpdate, _delta_l(policy, reference, update, 1.0), rollout, policy.parameters()) for update in
            (WHOLE, MICRO)]  # fmt: skip
    _assert_same_update(*runs)


def test_alpha_zero_trains_as_seq_sum_constant_and_alpha_one_does_not(models):
    policy, reference, _ = models
    rollout = _rollout(policy)
    constant = _options(policy, reference, policy_losses.PPOClip(), "seq-sum-constant", WHOLE)
    constant["aggregation"] = AggregationConfig(mode="seq-sum-constant", count_empty_rows=False)  # a row is empty
    dr_grpo = _run(PolicyUpdate, constant, rollout, policy.parameters())
    _assert_same_update(
        dr_grpo, _run(PolicyUpdate, _delta_l(policy, reference, WHOLE, 0.0), rollout, policy.parameters())
    )
    with pytest.raises(AssertionError):
        _assert_same_update(
            dr_grpo, _run(PolicyUpdate, _delta_l(policy, reference, WHOLE, 1.0), rollout, policy.parameters())
        )


def test_the_mini_batch_power_sum_counts_the_loss_mask(models):
    rollout = _rollout(models[0])
    mask = rollout.response_mask.clone()
    mask[0] = 0  # a row the loss leaves out (a truncated response under mask_truncated) weighs nothing
    sizes = mini_batch_sizes(rollout, mask, AggregationConfig(mode="delta-l", alpha=0.5), rollout.num_rows, False)
    lengths = [length for length in rollout.response_mask.sum(-1)[1:].tolist() if length > 0]
    assert sizes.length_power_sum.item() == pytest.approx(sum(length**-0.5 for length in lengths))
    assert sizes.of_rows(rollout)["length_power_sum"] is sizes.length_power_sum
    assert_close(length_powers(mask.sum(-1), 0.5)[0], torch.tensor(0.0))

"""Sampling log-probs from a generator other than the trainer: mismatch metrics, IS correction, old log-probs."""

import math

import pytest
import torch

from rlvr_lightning.core.aggregation import aggregate_loss
from rlvr_lightning.core.losses.soft_losses import VESPO
from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.modules.options import AggregationConfig, ImportanceSamplingConfig, UpdateConfig
from rlvr_lightning.modules.update.normalisers import MiniBatchSizes
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.rewards import SortInclusionOrderingReward

from .test_rlvr_module import fit


class EngineLikePolicy(ToySortPolicy):
    """Hands over its log-probs as an inference engine would: in `sampling_log_probs`, off by `offset`."""

    offset = 0.1
    exact = False

    def sample(self, batch, n, sampling):
        rollout = super().sample(batch, n, sampling)
        rollout.sampling_log_probs = rollout.old_log_probs - self.offset
        rollout.old_log_probs = None
        return rollout

    @property
    def sampling_log_probs_exact(self):
        return self.exact


def policy(**kwargs):
    torch.manual_seed(0)
    return EngineLikePolicy(vocab_size=5, prompt_length=3, embedding_dim=4, **kwargs)


def _rollout(module):
    rollout = module.policy.sample({"prompt": [[1, 2, 3], [3, 1, 0]]}, n=2, sampling=module.sampling)
    rollout.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    return rollout


def test_the_mismatch_is_logged_every_step(in_tmp_dir):
    module = RLVRModule(policy(), group_size=4)
    fit(module, [SortInclusionOrderingReward()], steps=2, batch_size=4)
    metrics = module.trainer.callback_metrics
    # trainer - sampler = offset on every token: |delta| = 0.1, r = e^0.1, k3 = e^0.1 - 0.1 - 1
    assert metrics["train/mismatch/abs_diff_mean"].item() == pytest.approx(0.1, abs=1e-6)
    assert metrics["train/mismatch/abs_diff_max"].item() == pytest.approx(0.1, abs=1e-6)
    assert metrics["train/mismatch/k3_kl"].item() == pytest.approx(math.exp(0.1) - 1.1, abs=1e-6)
    assert metrics["train/mismatch/is_weight_mean"].item() == pytest.approx(math.exp(0.1), abs=1e-6)
    assert metrics["train/mismatch/capped_fraction"].item() == 0.0


def test_token_truncated_is_weights_scale_the_policy_loss_by_hand():
    module = RLVRModule(policy(), loss="pg", rollout_is=ImportanceSamplingConfig(mode="token_truncate", max=1.05))
    plain = RLVRModule(module.policy, loss="pg")
    rollout = _rollout(module)
    num_tokens = rollout.response_mask.numel()
    corrected = module.policy_update.micro_batch_loss(
        rollout, None, MiniBatchSizes(rollout.num_rows, num_tokens), first_epoch=True
    ).loss
    # every token's weight is min(e^0.1, 1.05) = 1.05, so the (linear) pg loss scales by 1.05
    uncorrected = plain.policy_update.micro_batch_loss(
        rollout, None, MiniBatchSizes(rollout.num_rows, num_tokens), first_epoch=True
    ).loss
    assert corrected.item() == pytest.approx(1.05 * uncorrected.item(), rel=1e-6)


def test_the_loss_applies_the_is_weights_its_own_way():
    # VESPO folds the weights (every one min(e^0.1, 1.05) = 1.05) into its sequence weight, W = 1.05^T, rather
    # than multiplying each token's loss by 1.05: phi = W^k e^(lambda (1 - W)), (k, lambda) = (2, 3) for A >= 0
    # and (3, 2) for A < 0
    is_options = ImportanceSamplingConfig(mode="token_truncate", max=1.05)
    module = RLVRModule(policy(), loss=VESPO(), aggregation=AggregationConfig("token-mean"), rollout_is=is_options)
    rollout = _rollout(module)
    num_tokens = rollout.response_mask.numel()
    loss = module.policy_update.micro_batch_loss(
        rollout, None, MiniBatchSizes(rollout.num_rows, num_tokens), first_epoch=True
    ).loss
    log_probs, _ = module.policy.token_log_probs(rollout)
    w = 1.05 ** log_probs.shape[1]
    phi = torch.where(rollout.advantages >= 0, w**2 * math.exp(3 * (1 - w)), w**3 * math.exp(2 * (1 - w)))
    expected = (-phi[:, None] * rollout.advantages[:, None] * log_probs).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    times_weight = (-1.05 * rollout.advantages[:, None] * log_probs).mean()
    assert loss.item() != pytest.approx(times_weight.item(), rel=1e-3)


def test_is_weights_use_the_trainers_old_log_probs_when_they_were_recomputed():
    module = RLVRModule(policy(), loss="pg", rollout_is=ImportanceSamplingConfig(mode="token_mask", max=2.0))
    rollout = _rollout(module)
    log_probs, _ = module.policy.token_log_probs(rollout)
    rollout.old_log_probs = rollout.sampling_log_probs + 1.0  # r = e^1 = 2.7 > 2: every token masked
    loss = module.policy_update.micro_batch_loss(
        rollout, None, MiniBatchSizes(rollout.num_rows, rollout.response_mask.numel()), first_epoch=True
    ).loss
    assert loss.item() == 0.0
    expected = aggregate_loss(
        -rollout.advantages[:, None] * log_probs,
        None,
        module.aggregation.mode,
        num_sequences=4,
        num_tokens=rollout.response_mask.numel(),
    )
    assert expected.item() != 0.0


@pytest.mark.parametrize(
    "exact, rollout_is, recomputed", [(False, None, True), (True, None, False), (True, "token_truncate", True)]
)
def test_sampling_log_probs_serve_as_old_ones_only_when_exact_and_uncorrected(exact, rollout_is, recomputed):
    module = RLVRModule(policy(), update=UpdateConfig(epochs=2), rollout_is=ImportanceSamplingConfig(mode=rollout_is))
    module.policy.exact = exact
    rollout = _rollout(module)
    module.policy_update.add_old_and_reference_log_probs(rollout)
    assert (rollout.old_log_probs is rollout.sampling_log_probs) is not recomputed
    if recomputed:
        trainer, _ = module.policy.token_log_probs(rollout)
        torch.testing.assert_close(rollout.old_log_probs, trainer.detach())


def test_invalid_is_options_name_the_choices():
    with pytest.raises(ValueError, match="rollout_is.mode='tis' is not valid; choose one of"):
        RLVRModule(policy(), rollout_is=ImportanceSamplingConfig(mode="tis"))
    with pytest.raises(ValueError, match="rollout_is.min < rollout_is.max"):
        RLVRModule(policy(), rollout_is=ImportanceSamplingConfig(mode="token_mask", max=1.0, min=1.5))

"""`aggregation.mask_truncated` (DAPO's overlong filtering, TRL's `mask_truncated_completions`): truncated responses
leave the loss as if they had not been sampled, with the KL and entropy terms, in every aggregation mode; their
rewards still count in the advantages."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.losses.policy_losses import PPOClip
from rlvr_lightning.modules.options import AggregationConfig, UpdateConfig
from rlvr_lightning.modules.update.policy_update import PolicyUpdate
from tests.modules import test_packed_update as packed
from tests.modules.test_packed_update import _options, _rollout, _run

models, tokenizer_dir = packed.models, packed.tokenizer_dir  # the packed-update tests' tiny model (fixtures)

TRUNCATED = [1, 4]  # rows of `uneven_rollout` with 14 and 3 response tokens
WHOLE = UpdateConfig(max_grad_norm=None)  # one optimizer step over every row


def _update(models, rollout, mode, mask_truncated):
    policy, reference, _ = models
    options = _options(policy, reference, PPOClip(), mode, WHOLE)
    options["aggregation"] = AggregationConfig(mode=mode, count_empty_rows=False, mask_truncated=mask_truncated)
    _, metrics, steps = _run(PolicyUpdate, options, rollout, policy.parameters())
    return metrics["train/loss"], steps[0]


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum"])
def test_truncated_responses_leave_the_loss_as_if_never_sampled(models, mode):
    rollout = _rollout(models[0])
    rollout.truncated[TRUNCATED] = True
    kept = torch.tensor([i for i in range(rollout.num_rows) if i not in TRUNCATED])
    loss, grads = _update(models, rollout, mode, mask_truncated=True)
    kept_loss, kept_grads = _update(models, rollout.select(kept), mode, mask_truncated=True)
    assert loss == pytest.approx(kept_loss, abs=1e-6)
    for a, b in zip(grads, kept_grads, strict=True):
        assert_close(a, b, atol=1e-6, rtol=1e-5)
    # without the option the truncated responses train
    plain_loss, _ = _update(models, rollout, mode, mask_truncated=False)
    assert plain_loss != pytest.approx(loss, abs=1e-4)


def test_without_truncated_responses_the_option_changes_nothing(models):
    rollout = _rollout(models[0])
    assert _update(models, rollout, "token-mean", True)[0] == _update(models, rollout, "token-mean", False)[0]

"""The options TRL ships beside its losses, against TRL's own code restated line by line (`trl_restated.py`,
huggingface/trl f2cd577) on random padded inputs: values and gradients within 1e-6 in float64."""

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.aggregation import aggregate_loss
from rlvr_lightning.core.importance_sampling import mask_off_policy_sequences, rollout_is_weights
from rlvr_lightning.core.kl import kl_estimator
from rlvr_lightning.core.policy_losses import PPOClip
from tests.core.test_losses_against_trl import F64, TOL, random_batch, trl_is_ratio, value_and_grad
from tests.core.trl_restated import trl_grpo_loss

EPS = (0.2, 0.28)
BETA = 0.05


def reference_log_probs(log_probs, seed):
    generator = torch.Generator().manual_seed(100 + seed)
    return log_probs.detach() + 0.4 * torch.randn(log_probs.shape, generator=generator, **F64)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("first_update", [True, False])
@pytest.mark.parametrize("is_mode", [None, "token_truncate"])
def test_k3_is_matches_trls_bias_corrected_kl(seed, first_update, is_mode):
    log_probs, old, sampler, advantages, mask = random_batch(seed)
    ref = reference_log_probs(log_probs, seed)
    old = None if first_update else old
    trainer_old = log_probs.detach() if old is None else old
    weights = is_ratio = None
    if is_mode is not None:
        is_ratio = trl_is_ratio(trainer_old, sampler, mask.double(), is_mode, clip_max=1.1)
        weights = rollout_is_weights(trainer_old, sampler, mask, is_mode, max_weight=1.1)
    expected = trl_grpo_loss(
        log_probs, old, advantages, mask.double(), EPS, beta=BETA, ref_per_token_logps=ref,
        use_bias_correction_kl=True, importance_sampling_ratio=is_ratio,
    )  # fmt: skip
    loss = PPOClip(*EPS)
    out = loss(log_probs, old, advantages, mask) if weights is None else loss.with_rollout_is(
        log_probs, old, advantages, mask, weights
    )  # fmt: skip
    token_loss = out.loss + BETA * kl_estimator("k3_is").estimate(log_probs, ref, None, old)
    ours = aggregate_loss(token_loss, mask, "seq-mean-token-mean", num_sequences=mask.shape[0])
    expected = value_and_grad(expected, log_probs)
    assert_close(value_and_grad(ours, log_probs), expected, **TOL)
    # the uncorrected estimator gives TRL's default, not this
    plain = aggregate_loss(BETA * kl_estimator("k3").estimate(log_probs, ref), mask, "seq-mean-token-mean")
    corrected = aggregate_loss(
        BETA * kl_estimator("k3_is").estimate(log_probs, ref, None, old), mask, "seq-mean-token-mean"
    )
    assert not torch.allclose(value_and_grad(plain, log_probs)[1], value_and_grad(corrected, log_probs)[1], **TOL)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("sampler_given", [True, False])
@pytest.mark.parametrize("is_mode", [None, "token_mask"])
def test_off_policy_mask_matches_trl(seed, sampler_given, is_mode):
    log_probs, old, sampler, advantages, mask = random_batch(seed, rows=16)
    sampler = (sampler + 0.3) if sampler_given else None  # a divergence of ~0.3 (~0 without a sampler)
    threshold = 0.3 if sampler_given else 0.0  # about half the responses with a negative advantage leave
    weights = is_ratio = None
    if is_mode is not None and sampler is not None:
        is_ratio = trl_is_ratio(old, sampler, mask.double(), is_mode, clip_max=1.1)
        weights = rollout_is_weights(old, sampler, mask, is_mode, max_weight=1.1)
    expected = trl_grpo_loss(
        log_probs, old, advantages, mask.double(), EPS, off_policy_mask_threshold=threshold,
        sampling_per_token_logps=sampler, importance_sampling_ratio=is_ratio,
    )  # fmt: skip
    loss = PPOClip(*EPS)
    out = loss(log_probs, old, advantages, mask) if weights is None else loss.with_rollout_is(
        log_probs, old, advantages, mask, weights
    )  # fmt: skip
    # TRL falls back to the old log-probs where there are no sampler's: so does the update
    out = mask_off_policy_sequences(out, advantages, log_probs, old if sampler is None else sampler, mask, threshold)
    ours = aggregate_loss(out.loss, mask, "seq-mean-token-mean")
    assert_close(value_and_grad(ours, log_probs), value_and_grad(expected, log_probs), **TOL)
    assert 0 < float(out.stats["off_policy_masked_frac"]) < 1

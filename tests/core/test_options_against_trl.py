"""The options TRL ships beside its losses, against TRL's own code restated line by line (`trl_restated.py`,
huggingface/trl f2cd577) on random padded inputs: values and gradients within 1e-6 in float64."""

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.aggregation import aggregate_loss
from rlvr_lightning.core.importance_sampling import mask_off_policy_sequences, rollout_is_weights
from rlvr_lightning.core.kl import kl_estimator
from rlvr_lightning.core.losses.policy_losses import PPOClip
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


# ------------------------------------------------------------------ the restatement against TRL itself


def trl_own_loss(log_probs, old, advantages, mask, entropies=None, sampler=None, is_ratio=None, **options):
    """TRL 1.16's own GRPOTrainer._compute_loss (loss_type grpo) on a stand-in trainer, with `options`: beta,
    ref, use_bias_correction_kl, off_policy_mask_threshold, top_entropy_quantile (`pip install trl==1.16.0`)."""
    trainer_class = pytest.importorskip("trl.trainer.grpo_trainer").GRPOTrainer
    rows, tokens = log_probs.shape
    entropies = torch.zeros_like(log_probs) if entropies is None else entropies
    accelerator = SimpleNamespace(
        num_processes=1,
        gather=lambda x: x,
        gather_for_metrics=lambda x: x,
        reduce=lambda x, reduction: x,
        pad_across_processes=lambda x, dim, pad_index: x,
    )
    trainer = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (log_probs, entropies, None),
        top_entropy_quantile=options.get("top_entropy_quantile", 1.0),
        off_policy_mask_threshold=options.get("off_policy_mask_threshold"),
        importance_sampling_level="token",
        beta=options.get("beta", 0.0),
        loss_type="grpo",
        epsilon_low=EPS[0],
        epsilon_high=EPS[1],
        args=SimpleNamespace(delta=None, use_bias_correction_kl=options.get("use_bias_correction_kl", False)),
        use_vllm=is_ratio is not None,
        vllm_importance_sampling_correction=is_ratio is not None,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        accelerator=accelerator,
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics={"train": defaultdict(list)},
        get_off_policy_mask=trainer_class.get_off_policy_mask,
    )
    trainer.get_high_entropy_mask = lambda *args: trainer_class.get_high_entropy_mask(trainer, *args)
    inputs = {
        "prompt_ids": torch.zeros(rows, 1, dtype=torch.long),
        "prompt_mask": torch.ones(rows, 1, dtype=torch.long),
        "completion_ids": torch.zeros(rows, tokens, dtype=torch.long),
        "completion_mask": mask.double(),
        "advantages": advantages,
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum().double(),
        "importance_sampling_ratio": is_ratio,
        "ref_per_token_logps": options.get("ref"),
    }
    if sampler is not None:
        inputs["sampling_per_token_logps"] = sampler
    return trainer_class._compute_loss(trainer, None, inputs)


@pytest.mark.parametrize("option", ["bias_corrected_kl", "off_policy_mask", "top_entropy"])
def test_the_restatement_is_trls_own_loss(option):
    log_probs, old, sampler, advantages, mask = random_batch(0, rows=16)
    sampler = sampler + 0.3
    is_ratio = trl_is_ratio(old, sampler, mask.double(), "token_truncate", clip_max=1.1)
    entropies = torch.rand(log_probs.shape, generator=torch.Generator().manual_seed(3), **F64)
    options = {
        "bias_corrected_kl": dict(beta=BETA, ref=reference_log_probs(log_probs, 0), use_bias_correction_kl=True),
        "off_policy_mask": dict(off_policy_mask_threshold=0.3),
        "top_entropy": dict(top_entropy_quantile=0.3),
    }[option]
    own = trl_own_loss(log_probs, old, advantages, mask, entropies, sampler, is_ratio, **options)
    restated_options = {
        "beta": options.get("beta", 0.0),
        "ref_per_token_logps": options.get("ref"),
        "use_bias_correction_kl": options.get("use_bias_correction_kl", False),
        "off_policy_mask_threshold": options.get("off_policy_mask_threshold"),
        "top_entropy_quantile": options.get("top_entropy_quantile", 1.0),
    }
    restated = trl_grpo_loss(
        log_probs, old, advantages, mask.double(), EPS, sampling_per_token_logps=sampler, entropies=entropies,
        importance_sampling_ratio=is_ratio, **restated_options,
    )  # fmt: skip
    assert_close(value_and_grad(restated, log_probs), value_and_grad(own, log_probs), rtol=1e-12, atol=1e-12)

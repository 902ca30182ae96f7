"""The algorithm options of `core/` inside the update: with packed micro-batches (`update.micro_batch_tokens`)
they give the padded row micro-batches' loss and gradients (1e-5, fp32), with and without a token-level
`rollout_is` correction, over two optimizer steps (old log-probs read)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlvr_lightning.core.losses import policy_losses
from rlvr_lightning.modules.options import ImportanceSamplingConfig, KLConfig
from rlvr_lightning.modules.update.policy_update import PolicyUpdate
from tests.modules import test_packed_update as packed
from tests.modules.test_packed_update import PACKED, PADDED, SAMPLING, _assert_same_update, _options, _rollout, _run

models, tokenizer_dir = packed.models, packed.tokenizer_dir  # the fixtures: a tiny Llama policy and reference


def _with_sampler(rollout, seed=0):
    generator = torch.Generator().manual_seed(seed + 7)
    noise = 0.2 * torch.randn(rollout.old_log_probs.shape, generator=generator)
    rollout.sampling_log_probs = (rollout.old_log_probs + noise) * rollout.response_mask
    return rollout


def _same_update_packed_and_padded(models, rollout_is=None, loss=None, **options):
    policy, reference, _ = models
    rollout = _with_sampler(_rollout(policy))
    runs = []
    for update in (PADDED, PACKED):
        built = _options(policy, reference, loss or policy_losses.PPOClip(), "token-mean", update)
        if rollout_is is not None:
            built["rollout_is"] = rollout_is
        for name, value in options.items():
            built[name] = dataclasses.replace(built[name], **value) if isinstance(value, dict) else value
        runs.append(_run(PolicyUpdate, built, rollout, policy.parameters()))
    _assert_same_update(*runs)
    return runs


@pytest.mark.parametrize("rollout_is", [None, ImportanceSamplingConfig(mode="token_truncate", max=1.2)])
def test_k3_is_packed_matches_padded(models, rollout_is):
    _same_update_packed_and_padded(models, rollout_is, kl={"estimator": "k3_is"})


def test_k3_is_has_the_old_log_probs_read_once_the_policy_moves(models):
    policy, reference, _ = models
    options = _options(policy, reference, policy_losses.PolicyGradient(), "token-mean", PADDED)
    assert not PolicyUpdate(**options).needs_old_log_probs(6)  # pg reads none
    options["kl"] = KLConfig(coef=0.1, estimator="k3_is")
    assert PolicyUpdate(**options).needs_old_log_probs(6)  # 2 mini-batches: the second is off-policy
    assert not PolicyUpdate(**options).needs_old_log_probs(3)  # 1 update: the ratio is 1 by construction


SELECTING = {
    "clip_cov": lambda: policy_losses.ClipCov(clip_cov_ratio=0.2, clip_cov_lb=0.0, clip_cov_ub=100.0),
    "kl_cov": lambda: policy_losses.KLCov(kl_cov_ratio=0.2),
    "high_entropy": lambda: policy_losses.HighEntropyTokens(top_quantile=0.3),
    "high_entropy_shaped": lambda: policy_losses.HighEntropyTokens(policy_losses.EntropyShapedAdvantage(), 0.3),
}


@pytest.mark.parametrize("rollout_is", [None, ImportanceSamplingConfig(mode="token_truncate", max=1.2)])
@pytest.mark.parametrize("name", sorted(SELECTING))
def test_token_picks_over_the_mini_batch_are_the_same_packed_or_padded(models, name, rollout_is):
    """Three micro-batches of one row, or fewer packed ones: the same pick over the whole mini-batch (a pick per
    micro-batch would differ)."""
    runs = _same_update_packed_and_padded(models, rollout_is, loss=SELECTING[name]())
    assert (
        0
        < float(runs[0][1][f"train/{'selected_frac' if name.startswith('high_entropy') else 'cov_selected_frac'}"])
        < 1
    )


@pytest.mark.parametrize("rollout_is", [None, ImportanceSamplingConfig(mode="token_mask", max=1.2)])
def test_off_policy_sequence_masking_packed_matches_padded(models, rollout_is):
    threshold = {"off_policy_mask_threshold": 0.0}
    options = ImportanceSamplingConfig(off_policy_mask_threshold=0.0) if rollout_is is None else None
    runs = _same_update_packed_and_padded(
        models, options or dataclasses.replace(rollout_is, **threshold), loss=policy_losses.PPOClip()
    )
    assert 0 < float(runs[0][1]["train/off_policy_masked_frac"]) < 1


def test_off_policy_sequence_masking_has_the_old_log_probs_read_and_checks_its_threshold(models):
    policy, _, _ = models
    options = _options(policy, None, policy_losses.PolicyGradient(), "token-mean", PADDED)
    options["rollout_is"] = ImportanceSamplingConfig(off_policy_mask_threshold=0.5)
    assert PolicyUpdate(**options).needs_old_log_probs(6)  # pg alone reads none
    with pytest.raises(ValueError, match=r"rollout_is.off_policy_mask_threshold=-0.1 is not valid"):
        ImportanceSamplingConfig(off_policy_mask_threshold=-0.1)


@pytest.mark.parametrize("rollout_is", [None, ImportanceSamplingConfig(mode="token_truncate", max=1.2)])
def test_entropy_shaped_advantages_packed_match_padded(models, rollout_is):
    runs = _same_update_packed_and_padded(models, rollout_is, loss=policy_losses.EntropyShapedAdvantage(alpha=0.4))
    assert float(runs[0][1]["train/entropy_bonus"]) > 0


def test_entropy_shaping_reads_the_entropies_of_the_policy_being_trained(models):
    """The update with `EntropyShapedAdvantage(pg)` gives the gradients of `pg` on advantages shaped by hand from
    the policy's own entropies (the test's optimizer leaves the weights alone, so they hold for every step)."""
    policy, _, _ = models
    rollout = _rollout(policy)
    alpha, kappa = 0.05, 1.5
    with torch.no_grad():
        _, entropy = policy.token_log_probs(rollout, SAMPLING.temperature, with_entropy=True)
    adv = rollout.advantages[:, None]
    real = rollout.response_mask.bool()
    capped = (alpha * entropy > adv.abs() / kappa)[real]
    assert 0.2 < capped.float().mean() < 0.8  # the bonus reads the entropy on most tokens, the cap on the others
    by_hand = rollout.select(torch.arange(rollout.num_rows))
    # A_t + min(alpha H_t, |A_t| / kappa)  (Cheng et al. 2025 eq. 6), 0 on padding as the advantages there
    by_hand.advantages = (adv + torch.minimum(alpha * entropy, adv.abs() / kappa)) * rollout.response_mask
    runs = []
    for loss, data in (
        (policy_losses.EntropyShapedAdvantage(policy_losses.PolicyGradient(), alpha, kappa), rollout),
        (policy_losses.PolicyGradient(), by_hand),
    ):
        runs.append(_run(PolicyUpdate, _options(policy, None, loss, "token-mean", PADDED), data, policy.parameters()))
    _assert_same_update(*runs)

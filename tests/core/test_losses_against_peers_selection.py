"""ClipCov and KLCov against verl's own losses, HighEntropyTokens against TRL's entropy mask, each restated line by
line (`verl_restated.py`, `trl_restated.py`) on random padded inputs: values and gradients within 1e-6 in
float64. Alone (no ``selected``) the losses pick within their inputs, as the peers do per micro-batch."""

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.aggregation import aggregate_loss
from rlvr_lightning.core.importance_sampling import rollout_is_weights
from rlvr_lightning.core.losses.policy_losses import ClipCov, HighEntropyTokens, KLCov, PPOClip
from rlvr_lightning.core.losses.token_selection import pick_tokens
from tests.core.test_losses_against_trl import F64, TOL, random_batch, trl_is_ratio, value_and_grad
from tests.core.trl_restated import trl_grpo_loss
from tests.core.verl_restated import verl_clip_cov_loss, verl_kl_cov_loss


def spread_batch(seed, rows=8, tokens=9):
    """Advantages per token, and log-probs spread enough that several tokens fall in Clip-Cov's band."""
    log_probs, old, sampler, _, mask = random_batch(seed, rows, tokens)
    generator = torch.Generator().manual_seed(50 + seed)
    advantages = 2.0 * torch.randn(rows, tokens, generator=generator, **F64)
    return log_probs, old, sampler, advantages, mask


def token_mean(out, mask):
    return aggregate_loss(out.loss, mask, "token-mean", num_tokens=mask.sum())


@pytest.mark.parametrize("seed", range(5))
def test_clip_cov_matches_verl(seed):
    log_probs, old, _, advantages, mask = spread_batch(seed)
    options = dict(clip_cov_ratio=0.1, clip_cov_lb=0.2, clip_cov_ub=3.0)
    torch.manual_seed(seed)
    expected = verl_clip_cov_loss(old, log_probs, advantages, mask.double(), 0.2, 0.28, **options)
    expected = value_and_grad(expected, log_probs)
    torch.manual_seed(seed)  # the same random pick among the candidates
    out = ClipCov(clip_low=0.2, clip_high=0.28, **options)(log_probs, old, advantages, mask)
    assert 2 <= round(float(out.stats["cov_selected_frac"] * mask.sum())) < int(mask.sum())  # a pick, not all
    assert_close(value_and_grad(token_mean(out, mask), log_probs), expected, **TOL)


@pytest.mark.parametrize("seed", range(5))
def test_kl_cov_matches_verl(seed):
    log_probs, old, _, advantages, mask = spread_batch(seed)
    expected = value_and_grad(verl_kl_cov_loss(old, log_probs, advantages, mask.double(), 0.1, 0.7), log_probs)
    out = KLCov(kl_cov_ratio=0.1, ppo_kl_coef=0.7)(log_probs, old, advantages, mask)
    assert_close(value_and_grad(token_mean(out, mask), log_probs), expected, **TOL)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("is_mode", [None, "token_mask"])
def test_high_entropy_tokens_match_trl(seed, is_mode):
    log_probs, old, sampler, advantages, mask = random_batch(seed)
    entropy = torch.rand(log_probs.shape, generator=torch.Generator().manual_seed(seed), **F64) * 3
    is_ratio = weights = None
    if is_mode is not None:
        is_ratio = trl_is_ratio(old, sampler, mask.double(), is_mode, clip_max=1.1)
        weights = rollout_is_weights(old, sampler, mask, is_mode, max_weight=1.1)
    expected = trl_grpo_loss(
        log_probs, old, advantages, mask.double(), (0.2, 0.28), entropies=entropy, top_entropy_quantile=0.3,
        importance_sampling_ratio=is_ratio,
    )  # fmt: skip
    loss = HighEntropyTokens(PPOClip(0.2, 0.28), top_quantile=0.3)
    selected = pick_tokens(loss, log_probs, old, advantages, mask, entropy)
    if weights is None:
        out = loss(log_probs, old, advantages, mask, selected=selected)
    else:
        out = loss.with_rollout_is(log_probs, old, advantages, mask, weights, selected=selected)
    ours = aggregate_loss(out.loss, mask, "seq-mean-token-mean")
    assert_close(value_and_grad(ours, log_probs), value_and_grad(expected, log_probs), **TOL)

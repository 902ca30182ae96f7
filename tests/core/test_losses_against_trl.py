"""SAPO, LUSPO, VESPO and GSPO's rollout_is conventions against TRL 1.16 and AReaL on random inputs (float64).

``trl_loss`` restates TRL 1.16's ``GRPOTrainer._compute_loss`` (trl/trainer/grpo_trainer.py) line by line for
one process, one accumulation step, ``beta = 0``, no entropy or off-policy mask; ``trl_is_ratio`` its vLLM
importance-sampling ratio; ``areal_gspo_loss`` AReaL's ``ppo_actor_loss_fn`` (areal/utils/functional) with
``importance_sampling_level="sequence"`` and token-level rejection sampling. When TRL is installed (the
``bench`` extra), ``trl_loss`` is also checked against TRL's own ``_compute_loss``.
"""

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.aggregation import aggregate_loss
from rlvr_lightning.core.importance_sampling import rollout_is_weights
from rlvr_lightning.core.losses.policy_losses import GSPO, LUSPO, SAPO, VESPO, PPOClip

F64 = dict(dtype=torch.float64)
TOL = dict(rtol=1e-6, atol=1e-6)
SAPO_T = (1.0, 1.05)  # sapo_temperature_pos, sapo_temperature_neg
VESPO_K = (2.0, 3.0, 3.0, 2.0)  # vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg


def trl_gamma_weights(
    advantages, log_ratio_per_token, mask, importance_sampling_ratio, k_pos, lambda_pos, k_neg, lambda_neg
):
    """TRL 1.16 GRPOTrainer.get_gamma_weights."""
    with torch.no_grad():
        lower_clamp = math.log(1e-8)
        log_ratio_clamped = torch.clamp(log_ratio_per_token, -20.0, 20.0)
        seq_log_ratio = torch.sum(log_ratio_clamped * mask, dim=-1, keepdim=True)
        if importance_sampling_ratio is not None:
            log_is_ratio = torch.clamp(torch.log(importance_sampling_ratio), lower_clamp, 20.0)
            seq_log_ratio += torch.sum(log_is_ratio, dim=-1, keepdim=True)
        log_w_seq = torch.clamp(seq_log_ratio, lower_clamp, 20.0)
        w_seq = torch.exp(log_w_seq)
        is_nonneg_adv = advantages >= 0
        k_seq = torch.where(is_nonneg_adv, k_pos, k_neg)
        lambda_seq = torch.where(is_nonneg_adv, lambda_pos, lambda_neg).clamp(min=1e-4)
        log_phi = lambda_seq + k_seq * log_w_seq - lambda_seq * w_seq
        return torch.exp(log_phi).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def trl_loss(
    loss_type, per_token_logps, old_per_token_logps, advantages, mask, level, eps=(0.2, 0.2), is_ratio=None, delta=None
):
    """TRL 1.16 GRPOTrainer._compute_loss (the lines that reach the returned loss)."""
    advantages = advantages.unsqueeze(1)
    log_ratio = per_token_logps - old_per_token_logps
    if level == "token":
        log_importance_weights = log_ratio
    else:
        log_importance_weights = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        log_importance_weights = log_importance_weights.unsqueeze(-1)
    coef_1 = torch.exp(log_importance_weights)
    if loss_type in ["grpo", "luspo"]:
        coef_2 = torch.clamp(coef_1, 1 - eps[0], 1 + eps[1])
        if delta is not None:  # two-sided clipping (INTELLECT-2)
            coef_1 = torch.clamp(coef_1, max=delta)
        per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    elif loss_type == "sapo":
        temperatures = torch.where(advantages > 0, SAPO_T[0], SAPO_T[1])
        soft_coef_1 = torch.sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures
        per_token_loss = -soft_coef_1 * advantages
    elif loss_type == "vespo":
        phi_seq = trl_gamma_weights(advantages, log_ratio, mask, is_ratio, *VESPO_K)
        per_token_loss = -phi_seq * advantages * per_token_logps
    if is_ratio is not None and loss_type != "vespo":
        per_token_loss = per_token_loss * is_ratio
    if loss_type in ["grpo", "sapo"]:
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "vespo":  # num_items_in_batch: the batch's tokens
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    return (per_token_loss * mask).sum(-1).mean()  # luspo


def trl_is_ratio(old_per_token_logps, sampling_per_token_logps, mask, mode, clip_max, clip_min=None):
    """TRL 1.16 GRPOTrainer._generate_and_score_completions: the token-level vLLM importance-sampling ratio."""
    ratio = torch.exp((old_per_token_logps - sampling_per_token_logps) * mask)
    if mode == "token_truncate":
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    invalid = (ratio < (clip_min if clip_min is not None else -math.inf)) | (ratio > clip_max)
    return ratio.masked_fill(invalid, value=0.0)


def areal_gspo_loss(logprobs, proximal_logprobs, old_logprobs, advantages, eps_clip, loss_mask, upper):
    """AReaL ppo_actor_loss_fn, 2D inputs, importance_sampling_level="sequence", rejection_sampling with
    level="token", action="mask", metric="ratio", upper=`upper`."""
    loss_mask_count = loss_mask.count_nonzero() or 1
    behave_imp_weight = torch.exp(proximal_logprobs - old_logprobs)
    loss_mask = loss_mask & (behave_imp_weight <= upper)  # apply_rejection_sampling
    behave_imp_weight = torch.where(loss_mask, behave_imp_weight, 0.0)
    log_ratio = logprobs - proximal_logprobs  # _compute_sequence_level_ratio_and_advantages
    seq_log_ratio_mean = torch.where(loss_mask, log_ratio, 0.0).sum(dim=1) / loss_mask.sum(dim=1).clamp(min=1)
    ratio = torch.where(loss_mask, torch.exp(seq_log_ratio_mean.unsqueeze(1).expand_as(log_ratio)), 0.0)
    seq_lengths = loss_mask.sum(dim=-1, keepdim=True).clamp(min=1)
    advantages = (torch.where(loss_mask, advantages, 0.0).sum(dim=-1, keepdim=True) / seq_lengths).expand_as(log_ratio)
    advantages = torch.where(loss_mask, advantages, 0.0)
    clipped_ratio = torch.clamp(ratio, 1.0 - eps_clip, 1.0 + eps_clip)
    pg_loss = torch.max(-advantages * ratio, -advantages * clipped_ratio) * behave_imp_weight
    return torch.where(loss_mask, pg_loss, 0).sum() / loss_mask_count


def random_batch(seed, rows=6, tokens=7):
    generator = torch.Generator().manual_seed(seed)
    log_probs = (-2.0 * torch.rand(rows, tokens, generator=generator, **F64) - 0.05).requires_grad_()
    old = log_probs.detach() + 0.15 * torch.randn(rows, tokens, generator=generator, **F64)
    sampler = old + 0.15 * torch.randn(rows, tokens, generator=generator, **F64)
    lengths = torch.randint(1, tokens + 1, (rows,), generator=generator)
    mask = torch.arange(tokens) < lengths[:, None]
    advantages = torch.randn(rows, generator=generator, **F64)
    return log_probs, old, sampler, advantages, mask


def value_and_grad(scalar, log_probs):
    (grad,) = torch.autograd.grad(scalar, log_probs)
    return scalar.detach(), grad


def ours(loss, mode, log_probs, old, advantages, mask, weights=None, **aggregation):
    if weights is None:
        out = loss(log_probs, old, advantages, mask)
    else:
        out = loss.with_rollout_is(log_probs, old, advantages, mask, weights)
    return value_and_grad(aggregate_loss(out.loss, mask, mode, **aggregation), log_probs)


# (our loss, our aggregation, TRL loss_type, TRL importance_sampling_level, TRL epsilons)
CASES = {
    "sapo": (SAPO(*SAPO_T), "seq-mean-token-mean", "sapo", "token", (0.2, 0.2)),
    "luspo": (LUSPO(clip_low=0.05, clip_high=0.08), "seq-mean-token-sum", "luspo", "sequence", (0.05, 0.08)),
    "vespo": (VESPO(*VESPO_K), "token-mean", "vespo", "token", (0.2, 0.2)),
    "gspo": (GSPO(clip_low=0.05, clip_high=0.08), "seq-mean-token-mean", "grpo", "sequence", (0.05, 0.08)),
}


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("name", ["sapo", "luspo", "vespo"])
def test_losses_match_trl(name, seed):
    log_probs, old, _, advantages, mask = random_batch(seed)
    loss, mode, loss_type, level, eps = CASES[name]
    expected = value_and_grad(trl_loss(loss_type, log_probs, old, advantages, mask.double(), level, eps), log_probs)
    assert_close(ours(loss, mode, log_probs, old, advantages, mask), expected, **TOL)


@pytest.mark.parametrize("seed", range(5))
def test_dual_clip_is_trls_two_sided_clipping(seed):
    # TRL's `delta` caps the unclipped ratio before PPO's min: for A < 0 and r > delta the loss is -A delta with no
    # gradient, as dual-clip PPO's bound -A c; for A > 0 the clipped term already binds (delta > 1 + eps)
    log_probs, old, _, advantages, mask = random_batch(seed)
    old = log_probs.detach() - 5.0 * (log_probs.detach() - old).abs()  # ratios up to ~3: some beyond delta
    loss = PPOClip(clip_low=0.2, clip_high=0.28, dual_clip=1.5)
    out = loss(log_probs, old, advantages, mask)
    assert out.stats["dual_clip_frac"] > 0
    expected = trl_loss("grpo", log_probs, old, advantages, mask.double(), "token", (0.2, 0.28), delta=1.5)
    assert_close(
        ours(loss, "seq-mean-token-mean", log_probs, old, advantages, mask), value_and_grad(expected, log_probs), **TOL
    )


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("is_mode", ["token_truncate", "token_mask"])
@pytest.mark.parametrize("name", ["vespo", "gspo"])
def test_rollout_is_matches_trl(name, is_mode, seed):
    # VESPO folds the weights into its sequence weight; GSPO needs rollout_is_weight="row_mean" to match
    log_probs, old, sampler, advantages, mask = random_batch(seed)
    loss, mode, loss_type, level, eps = CASES[name]
    if name == "gspo":
        loss = GSPO(loss.clip_low, loss.clip_high, rollout_is_weight="row_mean")
    is_ratio = trl_is_ratio(old, sampler, mask.double(), is_mode, clip_max=1.1, clip_min=0.9)
    weights = rollout_is_weights(old, sampler, mask, is_mode, max_weight=1.1, min_weight=0.9)
    assert_close(torch.where(mask, weights, 0.0), torch.where(mask, is_ratio, 0.0))
    assert bool((weights[mask] == 0).any()) == (is_mode == "token_mask")  # the test has rejected tokens
    expected = trl_loss(loss_type, log_probs, old, advantages, mask.double(), level, eps, is_ratio)
    expected = value_and_grad(expected, log_probs)
    assert_close(ours(loss, mode, log_probs, old, advantages, mask, weights), expected, **TOL)
    if name == "gspo":  # the per-token weight gives the same value but another gradient
        value, grad = ours(GSPO(loss.clip_low, loss.clip_high), mode, log_probs, old, advantages, mask, weights)
        assert_close(value, expected[0], **TOL)
        assert not torch.allclose(grad, expected[1], **TOL)


@pytest.mark.parametrize("seed", range(5))
def test_gspo_row_mean_before_ratio_matches_areal(seed):
    log_probs, old, sampler, advantages, mask = random_batch(seed)
    loss = GSPO(clip_low=0.05, clip_high=0.05, rollout_is_weight="row_mean", rollout_is_rejection="before_ratio")
    loss.check("token-mean")  # the configuration the docstring names is one a run accepts
    weights = rollout_is_weights(old, sampler, mask, "token_mask", max_weight=1.1)
    token_advantages = advantages[:, None].expand_as(log_probs)
    expected = areal_gspo_loss(log_probs, old, sampler, token_advantages, 0.05, mask, upper=1.1)
    got = ours(loss, "token-mean", log_probs, old, advantages, mask, weights, num_tokens=mask.sum())
    assert_close(got, value_and_grad(expected, log_probs), **TOL)


# ------------------------------------------------------------------ the restatement against TRL itself


def trl_itself(loss_type, log_probs, old, advantages, mask, level, eps, is_ratio=None, delta=None):
    """TRL 1.16's own GRPOTrainer._compute_loss on a stand-in trainer (needs `pip install trl==1.16.0`)."""
    trainer_class = pytest.importorskip("trl.trainer.grpo_trainer").GRPOTrainer
    rows, tokens = log_probs.shape
    args = SimpleNamespace(
        delta=delta,
        use_bias_correction_kl=False,
        sapo_temperature_pos=SAPO_T[0],
        sapo_temperature_neg=SAPO_T[1],
        vespo_k_pos=VESPO_K[0],
        vespo_lambda_pos=VESPO_K[1],
        vespo_k_neg=VESPO_K[2],
        vespo_lambda_neg=VESPO_K[3],
        steps_per_generation=1,
    )
    accelerator = SimpleNamespace(
        num_processes=1, gather=lambda x: x, gather_for_metrics=lambda x: x, reduce=lambda x, reduction: x
    )
    trainer = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (log_probs, torch.zeros_like(log_probs), None),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=level,
        beta=0.0,
        loss_type=loss_type,
        epsilon_low=eps[0],
        epsilon_high=eps[1],
        args=args,
        use_vllm=is_ratio is not None,
        vllm_importance_sampling_correction=is_ratio is not None,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        accelerator=accelerator,
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics={"train": defaultdict(list)},
        get_gamma_weights=trainer_class.get_gamma_weights,
    )
    inputs = {
        "prompt_ids": torch.zeros(rows, 1, dtype=torch.long),
        "prompt_mask": torch.ones(rows, 1, dtype=torch.long),
        "completion_ids": torch.zeros(rows, tokens, dtype=torch.long),
        "completion_mask": mask.double(),
        "advantages": advantages,
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum().double(),
        "importance_sampling_ratio": is_ratio,
    }
    return trainer_class._compute_loss(trainer, None, inputs)


@pytest.mark.parametrize("is_mode", [None, "token_mask"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_restatement_is_trls_own_loss(name, is_mode):
    log_probs, old, sampler, advantages, mask = random_batch(0)
    _, _, loss_type, level, eps = CASES[name]
    is_ratio = None if is_mode is None else trl_is_ratio(old, sampler, mask.double(), is_mode, clip_max=1.1)
    expected = trl_itself(loss_type, log_probs, old, advantages, mask, level, eps, is_ratio)
    restated = trl_loss(loss_type, log_probs, old, advantages, mask.double(), level, eps, is_ratio)
    assert_close(value_and_grad(restated, log_probs), value_and_grad(expected, log_probs), rtol=1e-12, atol=1e-12)


def test_the_delta_restatement_is_trls_own_loss():
    log_probs, old, _, advantages, mask = random_batch(1)
    old = log_probs.detach() - 5.0 * (log_probs.detach() - old).abs()
    expected = trl_itself("grpo", log_probs, old, advantages, mask, "token", (0.2, 0.28), delta=1.5)
    restated = trl_loss("grpo", log_probs, old, advantages, mask.double(), "token", (0.2, 0.28), delta=1.5)
    assert_close(value_and_grad(restated, log_probs), value_and_grad(expected, log_probs), rtol=1e-12, atol=1e-12)

"""Group-relative advantage estimators (outcome rewards, one scalar per response).

Layout: ``num_prompts * group_size`` responses, the ``group_size`` responses of
one prompt stored contiguously. ``rewards`` is either flat ``[N]`` (then
``group_size`` is required) or already grouped ``[num_prompts, group_size]``
(then ``group_size`` may be ``None``). Every estimator returns a float tensor
of the SAME shape as its input; the trainer broadcasts it over the tokens of
each response.

Sign convention: a positive advantage means "make this response more likely".

Std-normalised estimators (``normalized``, ``batch_whitened``, ``token_whitened_returns``) give
exactly 0 to a normalisation group whose rewards agree to within ``ZERO_VARIANCE_RTOL`` of
their magnitude: rewards such as three 0.9s leave float rounding residues of ~1e-8 around their
mean, which divided by a std of the same size would be advantages of order 0.05 to 1.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _as_float(rewards: Tensor) -> Tensor:
    """Integer/bool rewards become the default float dtype; float dtypes are kept."""
    return rewards if rewards.is_floating_point() else rewards.to(torch.get_default_dtype())


def _grouped(rewards: Tensor, group_size: int | None) -> Tensor:
    """View ``rewards`` as ``[num_prompts, group_size]`` (validating the shapes)."""
    rewards = _as_float(rewards)
    if rewards.dim() == 2:
        if group_size is not None and group_size != rewards.shape[1]:
            raise ValueError(
                f"group_size={group_size} does not match rewards of shape {tuple(rewards.shape)} "
                f"(expected [num_prompts, group_size])"
            )
        return rewards
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be [N] or [num_prompts, group_size], got shape {tuple(rewards.shape)}")
    if group_size is None:
        raise ValueError("group_size is required when rewards are flat [N]")
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"group_size={group_size} must be >= 1 and divide the number of rewards ({rewards.numel()})")
    return rewards.view(-1, group_size)


def raw_advantages(rewards: Tensor, group_size: int | None = None) -> Tensor:
    """The rewards themselves: REINFORCE without a baseline."""
    # A_i = r_i  (Williams 1992, REINFORCE)
    return _as_float(rewards).clone()


def centered_advantages(rewards: Tensor, group_size: int | None = None, baseline_shift: float = 0.0) -> Tensor:
    """Reward minus its group's mean (no std division), minus ``baseline_shift`` (AsymRE's delta V; 0: none)."""
    grouped = _grouped(rewards, group_size)
    # A_i = r_i - mean(r_group)  (Dr. GRPO, Liu et al. 2025 "Understanding R1-Zero-Like Training", Fig. 1 / §3.1)
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    if baseline_shift:
        # A_i = r_i - (mean(r_group) + delta V)  (Arnal et al. 2025 AsymRE, arXiv:2506.20520 eq. 4)
        centered = centered - baseline_shift
    return centered.view_as(rewards)


def length_weighted_centered_advantages(rewards: Tensor, lengths: Tensor, group_size: int | None = None) -> Tensor:
    """Reward minus its group's mean weighted by the responses' lengths: OPO's optimal baseline.

    With one gradient step per rollout (exactly on-policy) and near-equal gradient norms per token, the baseline
    that minimises the gradient's variance weighs each response's reward by its length. Lengths of 0 (a group
    of empty responses) give a baseline of 0."""
    grouped = _grouped(rewards, group_size)
    weights = lengths.to(grouped.dtype).view_as(grouped)
    # A_i = r_i - sum_j |o_j| r_j / sum_j |o_j|  (Hao et al. 2025 OPO, arXiv:2505.23585; verl opo)
    baseline = (weights * grouped).sum(dim=1, keepdim=True) / weights.sum(dim=1, keepdim=True).clamp(min=1)
    return (grouped - baseline).view_as(rewards)


def weighted_reinforce_advantages(correct: Tensor, positive_weight: float = 0.1) -> Tensor:
    """``[N]`` float: ``positive_weight`` for a correct response, -1 for a wrong one (no baseline)."""
    correct = correct.bool()
    # A = lambda if correct else -1  (Zhu et al. 2025 W-REINFORCE, arXiv:2506.01347; RLVR-Decomposed a5d4e7c
    # verl/trainer/ppo/core_algos.py, advantage == 'weighted': the 0/1 reward times lambda, or minus 1)
    return torch.full(correct.shape, -1.0, device=correct.device).masked_fill(correct, positive_weight)


def greedy_baseline_advantages(rewards: Tensor, greedy_rewards: Tensor) -> Tensor:
    """Each reward minus the reward of the greedy response to the same prompt (``greedy_rewards``, one per row)."""
    # A_i = r(x, y_i) - r(x, y_greedy)  (Li et al. 2023 ReMax, arXiv:2310.10505 Alg. 1; verl remax)
    rewards = _as_float(rewards)
    return rewards - greedy_rewards.to(rewards.dtype)


def optimal_token_baseline_advantages(
    rewards: Tensor, response_mask: Tensor, token_energy: Tensor, group_size: int, zero_tail: bool = True,
    eps: float = 1e-8,
) -> Tensor:  # fmt: skip
    """Per-token advantages ``[N, T]``: each response's reward minus OTB's baseline at its token's step.

    The baseline at step k (a response's k-th sampled token; tool observations between turns are skipped) is
    the group's rewards weighted by each response's realized energy ``W_k``, the sum of ``token_energy`` over its
    first k + 1 sampled tokens; ``token_energy`` is ``1 - 2 pi(y_t) + sum_v pi(v)^2``, the squared norm of the
    gradient of ``log pi(y_t)`` in the logits (`core/log_probs.py` ``token_energy_from_logits``). A group with
    fewer than two non-empty responses has no baseline; with ``zero_tail``, neither has the tail of a group's
    single longest response past its second longest (there the baseline would be that response's own reward).
    0 on masked tokens."""
    mask = response_mask > 0
    num_rows, width = mask.shape
    lengths = mask.sum(dim=-1)
    steps = int(lengths.max()) if num_rows else 0
    alive = torch.arange(steps, device=mask.device) < lengths.unsqueeze(-1)  # [N, L]: row i's sampled tokens
    energy = torch.zeros(alive.shape, dtype=token_energy.dtype, device=mask.device)
    energy[alive] = token_energy[mask]  # row-major on both sides: row i's k-th sampled token to (i, k)
    realized = energy.cumsum(dim=-1) * alive  # W_k, 0 past the end
    groups = _grouped(rewards, group_size).shape[0]  # checks that the groups tile the rows
    returns = _as_float(rewards).to(realized.dtype).unsqueeze(-1) * alive  # outcome reward: G_k = R at every step
    weight = realized.view(groups, group_size, steps)
    # B*_k = sum_i G_k^i W_k^i / (sum_i W_k^i + eps)
    # (Li et al. 2026 OTB, arXiv:2602.07078; verl compute_multi_turn_optimal_token_baseline_advantage)
    baseline = (returns.view_as(weight) * weight).sum(dim=1) / (weight.sum(dim=1) + eps)
    baseline = baseline.unsqueeze(1).expand(groups, group_size, steps).clone()
    baseline[(lengths > 0).view(groups, group_size).sum(dim=1) < 2] = 0.0
    if zero_tail and group_size >= 2:
        grouped = lengths.view(groups, group_size)
        top = grouped.topk(2, dim=1).values
        unique = (grouped == top[:, :1]).sum(dim=1) == 1
        tail_rows = (grouped == top[:, :1]) & (unique & (top[:, 0] > top[:, 1])).unsqueeze(1)
        past_second = torch.arange(steps, device=mask.device) >= top[:, 1, None, None]
        baseline = baseline.masked_fill(tail_rows.unsqueeze(-1) & past_second, 0.0)
    advantages = torch.zeros((num_rows, width), dtype=realized.dtype, device=mask.device)
    advantages[mask] = (returns - baseline.view(num_rows, steps))[alive]
    return advantages


STD_SCOPES = ("group", "batch")
#: ``normalized_advantages``' quantile baselines: the paper's inf-quantile, or torch.quantile's interpolation
QUANTILE_METHODS = ("inverted_cdf", "linear")


def group_quantiles(grouped: Tensor, k: float, method: str = "inverted_cdf") -> Tensor:
    """``[P, 1]`` the ``k``-quantile of each row of ``grouped`` ``[P, G]``, ``0 < k < 1``.

    ``inverted_cdf``: the smallest reward whose share of the group at or below it reaches ``k`` (numpy's
    ``method="inverted_cdf"``); ``linear``: ``torch.quantile``'s interpolation between neighbouring ranks."""
    if not 0.0 < k < 1.0:
        raise ValueError(f"the quantile must be in (0, 1), got {k}")
    if method == "linear":
        # the QAE authors' code: torch.quantile(scores, quantile_k) in place of the mean (junkangwu/QAE README)
        return torch.quantile(grouped, k, dim=1, keepdim=True)
    if method != "inverted_cdf":
        raise ValueError(f"unknown quantile method {method!r}; valid choices: {', '.join(QUANTILE_METHODS)}")
    # b_K = inf{x : F(x) >= K}, F the group's empirical CDF  (Wu et al. 2025 QAE, arXiv:2509.22611 §4.1)
    rank = max(math.ceil(round(k * grouped.shape[1], 9)), 1)  # rounded: 0.4 * 10 is 4, not 4.000000000000001
    return grouped.sort(dim=1).values[:, rank - 1 : rank]


# Rewards within this relative distance of each other count as equal (float32 eps is 1.2e-7).
ZERO_VARIANCE_RTOL = 1e-6


def _all_equal(values: Tensor, dim: int | None = None, rtol: float = ZERO_VARIANCE_RTOL) -> Tensor:
    """True where ``max - min <= rtol * max|value|`` along ``dim`` (over everything when None)."""
    if dim is None:
        high, low = values.max(), values.min()
    else:
        high, low = values.max(dim=dim).values, values.min(dim=dim).values
    return (high - low) <= rtol * torch.maximum(high.abs(), low.abs())


def normalized_advantages(
    rewards: Tensor,
    group_size: int | None = None,
    eps: float = 1e-6,
    unbiased_std: bool = True,
    std_scope: str = "group",
    quantile: float | None = None,
    quantile_method: str = "inverted_cdf",
) -> Tensor:
    """GRPO advantage: centred by the group mean, divided by a std (+ eps).

    ``std_scope="group"``: std of the group (GRPO). ``std_scope="batch"``: std
    of all rewards in the batch, still centred by the group mean (Lite PPO).
    ``quantile``: the group's ``quantile``-quantile replaces its mean as the baseline (QAE; ``group_quantiles``).
    Groups whose rewards are equal (``zero_variance_group_mask``) get advantage exactly 0.
    """
    if std_scope not in STD_SCOPES:
        raise ValueError(f"unknown std_scope {std_scope!r}; valid choices: {', '.join(STD_SCOPES)}")
    grouped = _grouped(rewards, group_size)
    if grouped.shape[1] < 2:
        raise ValueError(
            f"normalized advantages need group_size >= 2, got {grouped.shape[1]}: the (unbiased) std of a "
            "single sample is undefined and its centred advantage is always 0"
        )
    if quantile is None:
        centered = grouped - grouped.mean(dim=1, keepdim=True)
    else:
        # A_i = (r_i - b_K) / (std + eps)  (Wu et al. 2025 QAE, arXiv:2509.22611 eq. 3)
        centered = grouped - group_quantiles(grouped, quantile, quantile_method)
    if std_scope == "group":
        std = grouped.std(dim=1, keepdim=True, unbiased=unbiased_std)
    else:
        # group mean, batch std
        # (Liu et al. 2025 "Tricks or Traps? A Deep Dive into RL for LLM Reasoning", Lite PPO §4.1)
        std = grouped.std(unbiased=unbiased_std)
    # A_i = (r_i - mean(r)) / (std(r) + eps)  (GRPO, Shao et al. 2024 DeepSeekMath §4.1.2 outcome supervision)
    advantages = centered / (std + eps)
    # no signal in an all-equal group: 0, not its rounding residue divided by a ~0 std
    advantages = advantages.masked_fill(_all_equal(grouped, dim=1).unsqueeze(1), 0.0)
    return advantages.view_as(rewards)


def mixed_advantages(rewards: Tensor, correct: Tensor, group_size: int | None = None, eps: float = 1e-6) -> Tensor:
    """MAPO's advantage: GRPO's `(r - mean) / (std + eps)` and the advantage percent deviation `(r - mean) /
    (mean + eps)` mixed by the group's trajectory certainty, `lambda(p) = 1 - 4 p (1 - p)` with `p` the share of
    correct responses: a group right (or wrong) nearly every time weighs the percent deviation, an even one GRPO's.
    Groups whose rewards are equal get exactly 0 (as `normalized_advantages`)."""
    grouped = _grouped(rewards, group_size)
    normalized = normalized_advantages(grouped, eps=eps)
    mean = grouped.mean(dim=1, keepdim=True)
    percent = ((grouped - mean) / (mean + eps)).masked_fill(_all_equal(grouped, dim=1).unsqueeze(1), 0.0)
    p = correct.reshape(grouped.shape).float().mean(dim=1, keepdim=True)
    certainty = 1 - 4 * p * (1 - p)
    # A = (1 - lambda(p)) (r - mu) / sigma + lambda(p) (r - mu) / mu  (Huang et al. 2025 MAPO, arXiv:2509.18849;
    # the authors' code, WenkeHuang/MAPO ray_trainer.py `grpomixpro`, p = the share of rewards equal to 1)
    return ((1 - certainty) * normalized + certainty * percent).view_as(rewards)


def normalize_then_sum_advantages(rewards: Tensor, weights: Tensor, group_size: int, eps: float = 1e-4) -> Tensor:
    """GDPO: ``[N]`` advantages from ``[N, K]`` rewards (one column per reward) and their ``[K]`` weights.

    Each reward is normalised within its group (``normalized_advantages``: unbiased std, an all-equal group gives
    0) before the weighted sum, which is then normalised over the batch; an all-equal sum gives 0."""
    if rewards.dim() != 2 or weights.shape != (rewards.shape[1],):
        raise ValueError(f"need rewards [N, K] and weights [K], got {tuple(rewards.shape)} and {tuple(weights.shape)}")
    rewards = _as_float(rewards)
    columns = [normalized_advantages(rewards[:, k], group_size, eps=eps) for k in range(rewards.shape[1])]
    # A_i = batch_norm(sum_k w_k (r_ik - mean_g r_k) / (std_g r_k + eps))  (GDPO, arXiv:2601.05242 §3; checked against
    # TRL f2cd577 grpo_trainer.py multi_objective_aggregation="normalize_then_sum"; verl gdpo whitens per token)
    total = (torch.stack(columns, dim=1) * weights.to(rewards.dtype)).sum(dim=1)
    if total.numel() < 2 or _all_equal(total):
        return torch.zeros_like(total)
    return (total - total.mean()) / (total.std(unbiased=True) + eps)


def max_only_advantages(rewards: Tensor, group_size: int | None = None) -> Tensor:
    """Keep the reward of responses that hit their group's max; everything else gets 0."""
    grouped = _grouped(rewards, group_size)
    group_max = grouped.max(dim=1, keepdim=True).values
    # A_i = r_i if r_i == max(r_group) else 0  (Stanford CS336 2025 lecture 17, compute_deltas mode "max_rewards")
    return torch.where(grouped == group_max, grouped, torch.zeros_like(grouped)).view_as(rewards)


def rloo_advantages(rewards: Tensor, group_size: int | None = None) -> Tensor:
    """Leave-one-out baseline: reward minus the mean of the OTHER rewards of the group."""
    grouped = _grouped(rewards, group_size)
    g = grouped.shape[1]
    if g < 2:
        raise ValueError(f"RLOO needs group_size >= 2 (the baseline averages the other samples), got {g}")
    # A_i = r_i - 1/(G-1) sum_{j!=i} r_j = G/(G-1) (r_i - mean)
    # (Ahmadian et al. 2024 "Back to Basics", RLOO estimator of Kool et al. 2019)
    others_mean = (grouped.sum(dim=1, keepdim=True) - grouped) / (g - 1)
    return (grouped - others_mean).view_as(rewards)


def batch_whitened_advantages(rewards: Tensor, group_size: int | None = None, eps: float = 1e-8) -> Tensor:
    """Whiten over the whole batch, ignoring groups (``group_size`` is unused); all-equal rewards give 0."""
    flat = _as_float(rewards)
    if flat.numel() < 2:
        raise ValueError(f"batch whitening needs at least 2 rewards to estimate a std, got {flat.numel()}")
    if _all_equal(flat):
        return torch.zeros_like(flat)
    # A_i = (r_i - mean(r_batch)) / (std(r_batch) + eps)  (REINFORCE++, Hu 2025, global batch normalisation)
    return (flat - flat.mean()) / (flat.std(unbiased=True) + eps)


def discounted_returns(rewards: Tensor, response_mask: Tensor, gamma: float = 1.0) -> Tensor:
    """``[N, T]`` returns of an outcome reward given at each response's last token, discounted by ``gamma``.

    With holes in the mask (multi-turn responses: tool observations) the exponent counts the sampled tokens
    after t, the policy's steps; the observations are not steps."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    mask = response_mask.to(_as_float(rewards).dtype)
    # tokens after t within the response: G_t = gamma^(L-1-t) r
    # (verl core_algos.compute_reinforce_plus_plus_outcome_advantage)
    tokens_after = mask.flip(-1).cumsum(-1).flip(-1) - 1.0
    return _as_float(rewards).unsqueeze(-1) * torch.pow(gamma, tokens_after.clamp(min=0.0)) * mask


def token_whitened_returns(rewards: Tensor, response_mask: Tensor, gamma: float = 1.0, eps: float = 1e-8) -> Tensor:
    """REINFORCE++ as verl computes it: per-token discounted returns whitened over every response token.

    Each token weighs the same in the mean and variance (a long response counts more than a short
    one, unlike ``batch_whitened_advantages``); ``eps`` is added to the variance, as in verl.
    """
    mask = response_mask.bool()
    if int(mask.sum()) < 2:
        raise ValueError("token whitening needs at least 2 response tokens to estimate a variance")
    returns = discounted_returns(rewards, response_mask, gamma)
    valid = returns[mask]
    if _all_equal(valid):
        return torch.zeros_like(returns)
    # (G - mean) / sqrt(var + eps), unbiased var over tokens
    # (verl core_algos: verl_F.masked_whiten(returns, response_mask))
    whitened = (returns - valid.mean()) * torch.rsqrt(valid.var(unbiased=True) + eps)
    return whitened * mask


def zero_variance_group_mask(rewards: Tensor, group_size: int | None) -> Tensor:
    """bool ``[num_prompts]``: True for groups whose rewards are all equal (no learning signal).

    Equal means within ``ZERO_VARIANCE_RTOL`` of the rewards' magnitude (``0.1 + 0.2`` equals ``0.3``)."""
    grouped = _grouped(rewards, group_size)
    # all-equal group <=> max == min  (DAPO, Yu et al. 2025 §3.2 dynamic sampling filters these groups)
    return _all_equal(grouped, dim=1)


def uniform_reward_groups(rewards: Tensor, group_index: Tensor, num_slots: int) -> Tensor:
    """bool ``[num_slots]`` by ``group_index`` (``< num_slots``): True for the prompts whose rewards ``[N]`` all
    agree (within ``ZERO_VARIANCE_RTOL``), whatever the order of their rows; False for an absent index."""
    rewards = _as_float(rewards)
    high = rewards.new_full((num_slots,), -math.inf).scatter_reduce(0, group_index, rewards, "amax")
    low = rewards.new_full((num_slots,), math.inf).scatter_reduce(0, group_index, rewards, "amin")
    present = torch.zeros(num_slots, dtype=torch.bool, device=rewards.device)
    present[group_index] = True
    return present & _all_equal(torch.stack([high, low]), dim=0)  # max == min, as zero_variance_group_mask


def valid_group_scale(rewards: Tensor, group_size: int | None) -> Tensor:
    """Scalar ``B / (B - M)``: ``B`` responses, ``M`` of them in groups whose rewards all agree (GPG's alpha).

    Those groups' advantages are 0, yet a token-mean loss still divides by their tokens; scaling every advantage
    by the inverse of the valid share undoes that dilution. 1 when no group is valid (every advantage is 0)."""
    all_equal = zero_variance_group_mask(rewards, group_size)
    valid = (~all_equal).sum()
    # alpha = B / (B - M)  (Chu et al. 2025 GPG, arXiv:2504.02546; the GPG code divides the loss by the valid share)
    return torch.where(valid > 0, all_equal.numel() / valid.clamp(min=1), torch.ones((), device=valid.device))


def zero_variance_group_fraction(rewards: Tensor, group_size: int | None) -> Tensor:
    """Scalar: fraction of groups whose rewards are all equal."""
    return zero_variance_group_mask(rewards, group_size).float().mean()

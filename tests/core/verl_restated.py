"""verl's Clip-Cov and KL-Cov policy losses restated line by line, with ``loss_agg_mode="token-mean"`` on one
data-parallel rank (``agg_loss``: the masked sum over the micro-batch's real tokens), its DPPO losses (the
unaggregated token losses, ``pg_losses``), and its GMPO loss (``geo_mean``, which takes the mean over responses
whatever ``loss_agg_mode`` says); and its REINFORCE++-baseline, OPO, Optimal Token Baseline and ReMax
advantages.

Source: verl-project/verl 1dda039b9c6311889a9c9a26040677e1254814f9, verl/trainer/ppo/core_algos.py:
``compute_policy_loss_clip_cov``, ``compute_policy_loss_kl_cov``, ``compute_policy_loss_dppo_tv``,
``compute_policy_loss_dppo_kl``, ``compute_policy_loss_geo_mean``, ``agg_loss``,
``compute_reinforce_plus_plus_baseline_outcome_advantage``, ``compute_opo_outcome_advantage``,
``compute_optimal_token_baseline_advantage``, ``compute_multi_turn_optimal_token_baseline_advantage`` (without
``rollout_is_weights``), ``compute_remax_outcome_advantage``; ``masked_mean`` and
``masked_whiten`` are verl/utils/torch_functional.py's.
"""

from __future__ import annotations

from collections import defaultdict

import torch


def verl_masked_mean(values, mask):
    return (values * mask).sum() / mask.sum()


def verl_clip_cov_loss(old_log_prob, log_prob, advantages, response_mask, cliprange_low, cliprange_high,
                       clip_cov_ratio, clip_cov_lb, clip_cov_ub):  # fmt: skip
    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    corr = torch.ones_like(advantages)
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange_low, 1 + cliprange_high)
    clip_by_origin = (pg_losses2 > pg_losses1) & (response_mask > 0)
    cov_all = (advantages - verl_masked_mean(advantages, response_mask)) * (
        log_prob - verl_masked_mean(log_prob.detach(), response_mask)
    )
    cov_all[response_mask == 0] = -torch.inf
    cov_all[clip_by_origin] = -torch.inf
    clip_num = max(int(clip_cov_ratio * response_mask.sum().item()), 1)
    top_k_idx = (cov_all < clip_cov_ub) & (cov_all > clip_cov_lb) & (response_mask > 0)
    top_k_idx = torch.nonzero(top_k_idx)
    if len(top_k_idx) > 0:
        perm = torch.randperm(len(top_k_idx))
        top_k_idx = top_k_idx[perm[: min(clip_num, len(top_k_idx))]]
    else:
        top_k_idx = torch.empty((0, 2), device=cov_all.device, dtype=torch.long)
    corr[top_k_idx[:, 0], top_k_idx[:, 1]] = 0
    pg_losses = torch.maximum(pg_losses1, pg_losses2) * corr
    return (pg_losses * response_mask).sum() / response_mask.sum()


def verl_kl_cov_loss(old_log_prob, log_prob, advantages, response_mask, kl_cov_ratio, ppo_kl_coef):
    negative_approx_kl = log_prob - old_log_prob
    abs_kl = negative_approx_kl.abs()
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses_kl = -advantages * ratio + ppo_kl_coef * abs_kl
    pg_losses = pg_losses1
    all_valid = response_mask > 0
    all_valid_idx = torch.nonzero(all_valid.reshape(-1), as_tuple=True)[0]
    all_valid_adv = advantages[all_valid].detach().reshape(-1).cpu()
    all_valid_logp = log_prob[all_valid].detach().reshape(-1).cpu()
    k = min(kl_cov_ratio, len(all_valid_adv))
    if k != 0:
        cov_lst_all = (all_valid_adv - all_valid_adv.mean()) * (all_valid_logp - all_valid_logp.mean())
        k_percent_nums = max(1, int(len(cov_lst_all) * kl_cov_ratio))
        large_cov_idxs = torch.topk(cov_lst_all, k_percent_nums, largest=True).indices
        if len(large_cov_idxs) != 0:
            large_cov_idxs = all_valid_idx[large_cov_idxs]
            rows, cols = large_cov_idxs // advantages.shape[1], large_cov_idxs % advantages.shape[1]
            pg_losses[rows, cols] = pg_losses_kl[rows, cols]
    return (pg_losses * response_mask).sum() / response_mask.sum()


def verl_dppo_token_losses(old_log_prob, log_prob, advantages, divergence, clip_divergence_low, clip_divergence_high,
                           clip_ratio_c=20.0, rollout_is_weights=None):  # fmt: skip
    """``pg_losses`` of ``compute_policy_loss_dppo_tv`` (divergence "tv") or ``_dppo_kl`` ("kl"), before
    ``agg_loss``."""
    negative_approx_kl = log_prob - old_log_prob
    negative_approx_kl = torch.clamp(negative_approx_kl, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    truncated_ratio = torch.clamp(ratio, max=clip_ratio_c)
    truncated_ratio = truncated_ratio.detach()
    prob = torch.exp(log_prob)
    old_prob = torch.exp(old_log_prob)
    if divergence == "tv":
        valid_positive_mask = (prob - old_prob) <= clip_divergence_high
        valid_negative_mask = (prob - old_prob) >= -clip_divergence_low
    else:
        binary_kl = old_prob * (old_log_prob - log_prob) + (1 - old_prob) * torch.log(
            (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8)
        )
        valid_positive_mask = (binary_kl <= clip_divergence_high) | (prob <= old_prob)
        valid_negative_mask = (binary_kl <= clip_divergence_low) | (prob >= old_prob)
    valid_mask = torch.where(advantages > 0, valid_positive_mask, valid_negative_mask)
    valid_mask = valid_mask.detach().float()
    pg_losses = -advantages * truncated_ratio * log_prob * valid_mask
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return pg_losses


def verl_agg_loss(loss_mat, loss_mask, loss_agg_mode, loss_scale_factor=None):
    """``agg_loss`` on one data-parallel rank, for "token-mean" and "seq-mean-token-sum(-norm)"."""
    if loss_agg_mode == "token-mean":
        return (loss_mat * loss_mask).sum() / loss_mask.sum()
    seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
    seq_mask = (torch.sum(loss_mask, dim=-1) > 0).float()
    loss = (seq_losses * seq_mask).sum() / seq_mask.sum()
    if loss_agg_mode == "seq-mean-token-sum-norm":
        loss /= loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
    return loss


def verl_masked_whiten(values, mask):
    mean = (values * mask).sum() / mask.sum()
    centered = values - mean
    var = (centered**2 * mask).sum() / mask.sum()
    var = var * mask.sum() / (mask.sum() - 1)  # masked_var(unbiased=True)
    return (values - mean) * torch.rsqrt(var + 1e-8)


def verl_reinforce_pp_baseline(token_level_rewards, response_mask, index):
    response_length = token_level_rewards.shape[-1]
    scores = token_level_rewards.sum(dim=-1)
    id2score = defaultdict(list)
    id2mean = {}
    bsz = scores.shape[0]
    for i in range(bsz):
        id2score[index[i]].append(scores[i])
    for idx in id2score:
        if len(id2score[idx]) == 1:
            id2mean[idx] = torch.tensor(0.0)
        else:
            id2mean[idx] = torch.mean(torch.stack(id2score[idx]))
    for i in range(bsz):
        scores[i] = scores[i] - id2mean[index[i]]
    scores = scores.unsqueeze(-1).tile([1, response_length]) * response_mask
    return verl_masked_whiten(scores, response_mask) * response_mask


def verl_opo(token_level_rewards, response_mask, index):
    response_length = response_mask.sum(dim=-1)
    scores = token_level_rewards.sum(dim=-1)
    id2score = defaultdict(list)
    id2len = defaultdict(list)
    id2bsl = {}
    bsz = scores.shape[0]
    for i in range(bsz):
        id2score[index[i]].append(scores[i])
        id2len[index[i]].append(response_length[i])
    for idx in id2score:
        if len(id2score[idx]) == 1:
            id2bsl[idx] = torch.tensor(0.0)
        else:
            score_tensor = torch.stack(id2score[idx])
            len_tensor = torch.stack(id2len[idx])
            id2bsl[idx] = (len_tensor * score_tensor).sum() / len_tensor.sum()
    for i in range(bsz):
        scores[i] = scores[i] - id2bsl[index[i]]
    return scores.unsqueeze(-1) * response_mask


def verl_geo_mean_loss(old_log_prob, log_prob, advantages, response_mask, cliprange_low, cliprange_high,
                       rollout_is_weights=None):  # fmt: skip
    negative_approx_kl = log_prob - old_log_prob
    sgn_advantage = torch.sign(advantages)
    negative_approx_kl_clamp = torch.clamp(negative_approx_kl, -cliprange_low, cliprange_high)
    negative_approx_kl_min = torch.min(sgn_advantage * negative_approx_kl, sgn_advantage * negative_approx_kl_clamp)
    negative_approx_kl_min = sgn_advantage * negative_approx_kl_min
    response_mask_sum = response_mask.sum(dim=-1)
    ratio = torch.exp((negative_approx_kl_min * response_mask).sum(dim=-1) / (response_mask_sum + 1e-8))
    advantage = (advantages * response_mask).sum(dim=-1) / (response_mask_sum + 1e-8)
    pg_losses = -advantage * ratio
    if rollout_is_weights is not None:
        seq_is_weights = torch.exp(
            (torch.log(rollout_is_weights + 1e-10) * response_mask).sum(dim=-1) / (response_mask_sum + 1e-8)
        )
        pg_losses = pg_losses * seq_is_weights
    return torch.mean(pg_losses)


def verl_grpo_passk(scores, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
    """compute_grpo_passk_outcome_advantage on outcome scores ``[bs]`` (the token-level rewards summed), ``index``
    the group of each row; returns the ``[bs]`` advantages (verl broadcasts them over the response mask)."""
    advantages = torch.zeros_like(scores)
    id2scores, id2indices = defaultdict(list), defaultdict(list)
    with torch.no_grad():
        for i in range(scores.shape[0]):
            id2scores[index[i]].append(scores[i])
            id2indices[index[i]].append(i)
        for idx in id2scores:
            rewards = torch.stack(id2scores[idx])
            topk, topk_idx = torch.topk(rewards, 2)
            r_max, r_second_max = topk[0], topk[1]
            i_max = id2indices[idx][topk_idx[0].item()]
            advantage = r_max - r_second_max
            if norm_adv_by_std_in_grpo:
                std = torch.std(rewards)
                advantage = advantage / (std + epsilon)
            advantages[i_max] = advantage
    return advantages


def verl_optimal_token_baseline(token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared,
                                handle_zero_tail=True, epsilon=1e-8):  # fmt: skip
    batch_size, seq_len = token_level_rewards.shape
    returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    pi_t = torch.exp(old_log_probs)
    w_per_timestep = 1 - 2 * pi_t + sum_pi_squared
    w_cumulative = (w_per_timestep * response_mask).cumsum(dim=-1)
    prompt_groups = defaultdict(list)
    for i in range(batch_size):
        prompt_groups[index[i]].append(i)
    baselines = torch.zeros_like(returns)
    for _, trajectory_indices in prompt_groups.items():
        N = len(trajectory_indices)
        if N == 1:
            continue
        traj_idx = torch.tensor(trajectory_indices)
        returns_group = returns[traj_idx]
        w_cumulative_group = w_cumulative[traj_idx]
        mask_group = response_mask[traj_idx]
        numerator = (returns_group * w_cumulative_group * mask_group).sum(dim=0)
        denominator = (w_cumulative_group * mask_group).sum(dim=0) + epsilon
        baseline_per_step = numerator / denominator
        baselines[traj_idx] = baseline_per_step.unsqueeze(0).expand(N, -1)
        if handle_zero_tail:
            response_lengths = mask_group.sum(dim=-1)
            sorted_lengths, _ = torch.sort(response_lengths)
            max_length = int(sorted_lengths[-1].item())
            second_max_length = int(sorted_lengths[-2].item())
            max_length_idx = (response_lengths == max_length).nonzero(as_tuple=True)[0]
            if max_length_idx.numel() == 1 and max_length > second_max_length:
                max_length_traj_idx = trajectory_indices[int(max_length_idx[0])]
                baselines[max_length_traj_idx, second_max_length:] = 0.0
    return (returns - baselines) * response_mask


def verl_tir_optimal_token_baseline(token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared,
                                    handle_zero_tail=True, epsilon=1e-8):  # fmt: skip
    token_returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    pi_t = torch.exp(old_log_probs)
    w_per_timestep = 1 - 2 * pi_t + sum_pi_squared
    w_cumulative = (w_per_timestep * response_mask).cumsum(dim=-1)
    response_lengths = response_mask.sum(dim=-1).to(dtype=torch.long)
    max_response_length = int(response_lengths.max().item()) if response_lengths.numel() > 0 else 0
    all_w_values = w_cumulative.new_zeros((len(response_lengths), max_response_length))
    all_returns = torch.zeros_like(all_w_values)
    for i in range(len(response_lengths)):
        length = int(response_lengths[i].item())
        if length == 0:
            continue
        mask = response_mask[i].bool()
        all_w_values[i, :length] = w_cumulative[i, mask]
        all_returns[i, :length] = token_returns[i, mask]
    prompt_groups = defaultdict(list)
    for i in range(len(response_lengths)):
        if response_lengths[i] == 0:
            continue
        prompt_groups[index[i]].append(i)
    baselines = torch.zeros_like(all_returns)
    for _, trajectory_indices in prompt_groups.items():
        N = len(trajectory_indices)
        traj_idx = torch.tensor(trajectory_indices)
        if N == 1:
            baselines[traj_idx[0]] = 0.0
            continue
        w_group = all_w_values[traj_idx]
        R_group = all_returns[traj_idx]
        b_star = (R_group * w_group).sum(dim=0) / (w_group.sum(dim=0) + epsilon)
        baselines[traj_idx] = b_star.to(baselines.dtype)
        if handle_zero_tail:
            response_lengths_group = response_lengths[traj_idx]
            sorted_lengths, _ = torch.sort(response_lengths_group)
            max_length = int(sorted_lengths[-1].item())
            second_max_length = int(sorted_lengths[-2].item())
            max_length_idx = (response_lengths_group == max_length).nonzero(as_tuple=True)[0]
            if max_length_idx.numel() == 1 and max_length > second_max_length:
                max_length_traj_idx = trajectory_indices[int(max_length_idx[0])]
                baselines[max_length_traj_idx, second_max_length:] = 0.0
    all_advantages = all_returns - baselines
    advantages = torch.zeros_like(token_returns)
    for i in range(len(response_lengths)):
        if response_lengths[i] == 0:
            continue
        advantages[i, response_mask[i].bool()] = all_advantages[i, : response_lengths[i]]
    return advantages * response_mask


def verl_remax(token_level_rewards, reward_baselines, response_mask):
    returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    return returns - reward_baselines.unsqueeze(-1) * response_mask

"""TRL's GRPO options restated line by line for one process and one accumulation step, float64.

Source: huggingface/trl f2cd57710ae345ea6428ae95363267fcf38a3dc8, trl/trainer/grpo_trainer.py:
``GRPOTrainer._compute_loss`` (``loss_type`` grpo or dapo, token-level ratio, ``beta``,
``use_bias_correction_kl``, ``off_policy_mask_threshold``, ``top_entropy_quantile``, the vLLM importance-sampling
ratio), ``get_off_policy_mask``, ``get_high_entropy_mask`` (one process: the gather is the identity) and the
``normalize_then_sum`` branch of ``_generate_and_score_completions`` with ``nanstd`` (trl/trainer/utils.py);
trl/experimental/iw_opd/iw_opd_trainer.py: ``IWOPDTrainer._compute_iw_opd_loss`` (`trl_iw_opd_loss`).
"""

from __future__ import annotations

import torch


def trl_nanstd(tensor, dim=None, keepdim=False):
    """trl/trainer/utils.py nanstd (Bessel-corrected, NaN-aware)."""
    mean = torch.nanmean(tensor, dim=dim, keepdim=True)
    variance = torch.nanmean((tensor - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(tensor), dim=dim, keepdim=True)
    correction = torch.where(count > 1, count / (count - 1), torch.full_like(count / 1.0, float("nan")))
    std = torch.sqrt(variance * correction)
    if keepdim:
        return std
    return std.squeeze() if dim is None else std.squeeze(dim)


def trl_high_entropy_mask(entropies, mask, threshold):
    """GRPOTrainer.get_high_entropy_mask on one process (threshold = 1 - top_entropy_quantile)."""
    gathered = entropies[mask.bool()].float()
    if gathered.numel() == 0:
        return torch.zeros_like(entropies, dtype=torch.bool)
    entropy_threshold = torch.quantile(gathered, threshold)
    masked_entropies = entropies * mask.float()
    return (masked_entropies >= entropy_threshold) & mask.bool()


def trl_off_policy_mask(advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold):
    """GRPOTrainer.get_off_policy_mask: (B, 1), 1 = keep."""
    kl_div = sampling_per_token_logps - per_token_logps.detach()
    seq_kl_sum = (kl_div * mask).sum(dim=1, keepdim=True)
    avg_seq_kl = seq_kl_sum / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    is_pos_adv = advantages >= 0
    is_low_kl = avg_seq_kl <= off_policy_threshold
    return (is_pos_adv | is_low_kl).to(dtype=mask.dtype)


def trl_grpo_loss(
    per_token_logps,
    old_per_token_logps,
    advantages,
    mask,
    eps=(0.2, 0.2),
    loss_type="grpo",
    beta=0.0,
    ref_per_token_logps=None,
    use_bias_correction_kl=False,
    off_policy_mask_threshold=None,
    sampling_per_token_logps=None,
    entropies=None,
    top_entropy_quantile=1.0,
    importance_sampling_ratio=None,
):
    """GRPOTrainer._compute_loss: the lines that reach the returned loss for these options."""
    if top_entropy_quantile < 1.0:
        entropy_mask = trl_high_entropy_mask(entropies, mask, 1 - top_entropy_quantile)
    else:
        entropy_mask = None
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    old_per_token_logps = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps
    if off_policy_mask_threshold is not None:
        sampling = old_per_token_logps if sampling_per_token_logps is None else sampling_per_token_logps
        off_policy_mask = trl_off_policy_mask(advantages, per_token_logps, sampling, mask, off_policy_mask_threshold)
    log_ratio = per_token_logps - old_per_token_logps
    coef_1 = torch.exp(log_ratio)
    if beta != 0.0:
        per_token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
        if use_bias_correction_kl:
            per_token_kl = per_token_kl * coef_1
    coef_2 = torch.clamp(coef_1, 1 - eps[0], 1 + eps[1])
    per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    if off_policy_mask_threshold is not None:
        per_token_loss = per_token_loss * off_policy_mask
    if entropy_mask is not None:
        per_token_loss = per_token_loss * entropy_mask
    if importance_sampling_ratio is not None:
        per_token_loss = per_token_loss * importance_sampling_ratio
    if beta != 0.0:
        per_token_loss = per_token_loss + beta * per_token_kl
    if loss_type == "grpo":
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)  # dapo: num_items_in_batch, one process


def trl_normalize_then_sum(rewards_per_func, reward_weights, num_generations):
    """The normalize_then_sum branch of GRPOTrainer._generate_and_score_completions: advantages [B]."""
    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    grouped = rewards_per_func.view(-1, num_generations, rewards_per_func.shape[1])
    mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
    std_k = trl_nanstd(grouped, dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean_k)
    reward_k = (grouped - mean_k) / (std_k + 1e-4)
    reward_k = reward_k.view(-1, rewards_per_func.shape[1])
    rewards = (reward_k * reward_weights.unsqueeze(0)).nansum(dim=1)
    rewards[unscorable_mask] = torch.nan
    std_rewards = trl_nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    advantages = (rewards - torch.nanmean(rewards)) / (std_rewards + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


def trl_iw_opd_loss(student_logits, completion_tokens, labels, teacher_actual_logprobs, rollout_logprobs, gamma, eps):
    """IWOPDTrainer._compute_iw_opd_loss (trl/experimental/iw_opd/iw_opd_trainer.py, same commit): temperature 1,
    ``num_items_in_batch`` None (the mean over the valid tokens); the metrics and the missing-teacher check left
    out. ``labels`` -100: not a completion token."""
    student_log_probs = torch.log_softmax(student_logits, dim=-1)
    student_actual_logprobs = student_log_probs.gather(dim=-1, index=completion_tokens.unsqueeze(-1)).squeeze(-1)
    valid_mask = labels != -100
    safe_teacher_logprobs = torch.where(valid_mask, teacher_actual_logprobs, 0.0)
    if rollout_logprobs is None:
        rollout_logprobs = student_actual_logprobs
    safe_rollout_logprobs = torch.where(valid_mask, rollout_logprobs, 0.0)
    a_opd = (safe_teacher_logprobs - safe_rollout_logprobs).detach()
    a_opd = torch.where(valid_mask, a_opd, torch.zeros_like(a_opd))
    abs_advantages = a_opd.abs()
    prefix_abs_advantages = abs_advantages.cumsum(dim=1) - abs_advantages
    total_abs_advantages = abs_advantages.sum(dim=1, keepdim=True).clamp_min(eps)
    weights = (1.0 + gamma * (1.0 - prefix_abs_advantages / total_abs_advantages)).detach()
    advantages = weights * a_opd
    loss = -student_actual_logprobs * advantages
    loss = torch.where(valid_mask, loss, torch.zeros_like(loss))
    return loss.sum() / valid_mask.sum().clamp_min(1)

"""Generalised advantage estimation (GAE) for PPO with a learned critic, over ragged responses.

Token ``t`` of a response is an action taken in state ``s_t`` (the prompt and the response's first
``t`` tokens); ``values[:, t]`` is the critic's ``V(s_t)``, read off the same position that predicts
token ``t``. The episode ends after the response's last real token (``response_mask``), so the
value after it is 0. Positions where ``response_mask == 0`` are skipped: they neither contribute a
TD error nor pass on the next value (verl ``core_algos.compute_gae_advantage_return``), and their
advantages and returns are 0.

    delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)
    A_t     = delta_t + gamma * lam * A_{t+1}
    R_t     = A_t + V(s_t)                         (the critic's regression target)

With ``gamma = lam = 1`` the advantage is the return minus the value: ``A_t = sum_{k>=t} r_k - V(s_t)``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def outcome_token_rewards(rewards: Tensor, response_mask: Tensor) -> Tensor:
    """``[N, T]``: each response's scalar reward on its last real token, 0 elsewhere.

    A response without any real token has nowhere to put its reward: its row is all 0.
    """
    if rewards.dim() != 1 or response_mask.dim() != 2 or rewards.shape[0] != response_mask.shape[0]:
        raise ValueError(
            f"rewards must be [N] and response_mask [N, T], got {tuple(rewards.shape)} and {tuple(response_mask.shape)}"
        )
    mask = response_mask.bool()
    dtype = rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()
    token_rewards = torch.zeros(mask.shape, dtype=dtype, device=rewards.device)
    if mask.shape[1] == 0:
        return token_rewards
    # index of the last real token: the position of the highest mask column that is 1
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, -1).max(dim=-1).values
    has_token = last >= 0
    # the outcome score sits on the EOS token (verl ray_trainer: token_level_scores[last valid index] = score)
    rows = torch.arange(mask.shape[0], device=mask.device)[has_token]
    token_rewards[rows, last[has_token]] = rewards[has_token].to(dtype)
    return token_rewards


def length_adaptive_lambda(lengths: Tensor, alpha: float = 0.05) -> Tensor:
    """Each response's GAE lambda from its length ``[N]``: ``1 - 1 / (alpha * length)``, clipped to [0, 1] (a response
    shorter than ``1 / alpha`` tokens gets 0, the one-step TD error), so that the sum of the lambda weights grows with
    the length."""
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    lengths = lengths.to(torch.get_default_dtype() if not lengths.is_floating_point() else lengths.dtype)
    # lambda_policy = 1 - 1 / (alpha l)  (Yue et al. 2025 VAPO, arXiv:2504.05118, sec. 3.2: length-adaptive GAE)
    return (1.0 - 1.0 / (alpha * lengths.clamp(min=1.0))).clamp(0.0, 1.0)


def gae_advantages(
    token_rewards: Tensor, values: Tensor, response_mask: Tensor, gamma: float = 1.0, lam: float | Tensor = 1.0
) -> tuple[Tensor, Tensor]:
    """``(advantages, returns)``, both ``[N, T]`` and 0 where ``response_mask == 0``; no gradient flows.

    ``token_rewards``, ``values`` and ``response_mask`` are ``[N, T]``; ``lam`` is one lambda or one per row ``[N]``
    (`length_adaptive_lambda`). Advantages are not whitened here (``masked.masked_normalize`` does that, as verl
    does after GAE); returns are ``advantages + values``.
    """
    lam_range = (float(lam.min()), float(lam.max())) if isinstance(lam, Tensor) and lam.numel() else (lam, lam)
    if not 0.0 <= gamma <= 1.0 or not (0.0 <= lam_range[0] and lam_range[1] <= 1.0):
        raise ValueError(f"gamma and lam must be in [0, 1], got gamma={gamma} and lam={lam}")
    if isinstance(lam, Tensor):
        if lam.shape != values.shape[:1]:
            raise ValueError(f"a lam per row must be [N], got {tuple(lam.shape)} for values {tuple(values.shape)}")
        lam = lam.to(values.dtype)
    if token_rewards.shape != values.shape or values.shape != response_mask.shape or values.dim() != 2:
        raise ValueError(
            "token_rewards, values and response_mask must all be [N, T], got "
            f"{tuple(token_rewards.shape)}, {tuple(values.shape)} and {tuple(response_mask.shape)}"
        )
    with torch.no_grad():
        mask = response_mask.to(values.dtype)
        rewards = token_rewards.to(values.dtype) * mask
        values = values.detach() * mask
        next_value = values.new_zeros(values.shape[0])
        next_advantage = values.new_zeros(values.shape[0])
        advantages = torch.zeros_like(values)
        for t in reversed(range(values.shape[1])):
            # delta_t = r_t + gamma V(s_{t+1}) - V(s_t); A_t = delta_t + gamma lam A_{t+1}
            # (Schulman et al. 2016, GAE eq. 16)
            delta = rewards[:, t] + gamma * next_value - values[:, t]
            advantage = delta + gamma * lam * next_advantage
            m = mask[:, t]
            # a masked position passes the next value and advantage through unchanged
            # (verl compute_gae_advantage_return)
            next_value = values[:, t] * m + next_value * (1 - m)
            next_advantage = advantage * m + next_advantage * (1 - m)
            advantages[:, t] = advantage * m
        returns = (advantages + values) * mask
    return advantages, returns

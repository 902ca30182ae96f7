"""SPO's persistent value tracker: a Beta posterior over each prompt's success probability, discounted by how far
the policy has moved since the prompt was last sampled, and the single-stream advantage it gives.

Single-stream Policy Optimization (Xu and Ding 2025, arXiv:2509.13232) keeps, per prompt, ``alpha`` and
``beta`` with the value estimate ``p = alpha / (alpha + beta)``. A response with reward ``r`` in [0, 1] gets the
advantage ``r - p`` (``p`` before this step's update), normalised over the whole batch; after the step the
tracker forgets at rate ``rho`` and counts the new reward:

    alpha <- rho alpha + r,   beta <- rho beta + (1 - r)
    rho = clip(2^(-D / D_half), rho_min, rho_max)

``D``: the mean ``|log pi_then - log pi_now|`` over the tokens of the prompt's previous response, the policy then
being the one just after the step that sampled it (the authors' ``_get_spo_rho``: D_half 0.06, rho in
[0.875, 0.96]). A prompt's first tracker comes from ``n`` responses of the policy that meets it: ``alpha = N_0 (s +
1/2) / (n + 1)``, ``beta = N_0 (n - s + 1/2) / (n + 1)`` with ``s`` their summed rewards and ``N_0 = 1 / (1 -
rho_min)`` (the effective sample count the forgetting settles at); ``n = 0``: ``alpha = beta = 1/2``.

Prioritized sampling draws a step's prompts, without replacement, from a larger batch with probability
proportional to ``sqrt(p (1 - p)) + epsilon``: the prompts whose outcome is least certain teach the most.
"""

from __future__ import annotations

import torch
from torch import Tensor


def initial_tracker(successes: Tensor, samples: int, rho_min: float) -> tuple[Tensor, Tensor]:
    """``(alpha, beta)`` of prompts whose ``samples`` first responses summed ``successes`` rewards."""
    if samples == 0:
        half = torch.full_like(successes, 0.5)
        return half, half.clone()
    n0 = 1.0 / (1.0 - rho_min)
    # alpha = N0 (s + 1/2) / (n + 1), beta = N0 (n - s + 1/2) / (n + 1)  (Xu and Ding 2025 SPO, arXiv:2509.13232,
    # offline value initialisation; the authors' spo_ray_trainer.fit)
    return n0 * (successes + 0.5) / (samples + 1), n0 * (samples - successes + 0.5) / (samples + 1)


def forgetting_rate(drift: Tensor, d_half: float, rho_min: float, rho_max: float) -> Tensor:
    """``rho = clip(2^(-D / D_half), rho_min, rho_max)`` for each prompt's policy drift ``D``."""
    # (SPO, arXiv:2509.13232, the KL-adaptive discount; the authors' _get_spo_rho)
    return torch.clamp(torch.pow(2.0, -drift / d_half), min=rho_min, max=rho_max)


def mean_abs_log_ratio(then: Tensor, now: Tensor, mask: Tensor) -> Tensor:
    """``D`` per row ``[N]``: the mean of ``|log pi_then - log pi_now|`` over a response's tokens ``[N, T]``."""
    mask = mask.to(then.dtype)
    return ((then - now).abs() * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)


def tracked(
    alpha: Tensor, beta: Tensor, rho: Tensor, rewards: Tensor, count: Tensor | int = 1
) -> tuple[Tensor, Tensor]:
    """The tracker once it has forgotten at ``rho`` and seen ``count`` responses whose rewards sum to ``rewards``."""
    # alpha <- rho alpha + r, beta <- rho beta + (1 - r)  (SPO, arXiv:2509.13232; the authors' spo_ray_trainer.fit)
    return rho * alpha + rewards, rho * beta + (count - rewards)


def sampling_weights(values: Tensor, explore: float) -> Tensor:
    """Each prompt's weight in prioritized sampling: ``sqrt(p (1 - p)) + explore`` for its value ``p``."""
    # w = sqrt(p (1 - p)) + epsilon  (SPO, arXiv:2509.13232, prioritized sampling; the authors' prompt2weight, 0.05)
    return (values * (1.0 - values)).clamp_min(0.0).sqrt() + explore


def prioritized_draw(weights: Tensor, keep: int, generator: torch.Generator | None = None) -> Tensor:
    """The positions of ``keep`` of the prompts, drawn one after another without replacement, each draw with
    probability proportional to the weights left (numpy's ``choice(replace=False, p=...)``, the authors'), in
    ascending order."""
    if keep > weights.numel():
        raise ValueError(f"cannot draw {keep} prompts without replacement from {weights.numel()}")
    return torch.multinomial(weights.double(), keep, replacement=False, generator=generator).sort().values


def single_stream_advantages(rewards: Tensor, values: Tensor, eps: float = 1e-8) -> Tensor:
    """``r - p`` normalised over the batch (its mean removed, divided by its unbiased std + eps)."""
    raw = rewards - values
    if raw.numel() < 2:
        return raw - raw.mean()
    # A = (r - p - mean) / (std + eps) over the whole batch  (SPO, arXiv:2509.13232, global advantage normalisation;
    # the authors' spo_ray_trainer.fit)
    return (raw - raw.mean()) / (raw.std() + eps)

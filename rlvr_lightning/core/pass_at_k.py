"""Unbiased pass@k from n samples of which c are correct (Chen et al. 2021), and advantages that train for it."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _validate(n: int, k: int) -> None:
    if n < 1 or k < 1:
        raise ValueError(f"need n >= 1 and k >= 1, got n={n}, k={k}")
    if k > n:
        raise ValueError(f"pass@k needs k <= n (number of samples), got k={k} > n={n}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples (drawn without replacement from n) is correct."""
    _validate(n, k)
    if not 0 <= c <= n:
        raise ValueError(f"number of correct samples c must be in [0, n={n}], got {c}")
    if n - c < k:
        return 1.0
    # 1 - C(n-c, k)/C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k/i)
    # (Chen et al. 2021 "Evaluating LLMs Trained on Code", eq. 1 + Fig. 3 stable form)
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pass_at_k_tensor(n: int, correct: Tensor, k: int) -> Tensor:
    """``pass_at_k`` for every prompt: ``correct`` is ``[num_prompts]`` counts -> float32 ``[num_prompts]``."""
    _validate(n, k)
    c = correct.to(torch.float64).unsqueeze(-1)  # [P, 1]
    if ((c < 0) | (c > n)).any():
        raise ValueError(f"correct counts must be in [0, n={n}], got {correct.tolist()}")
    i = torch.arange(1, n + 1, dtype=torch.float64, device=correct.device)  # [n]
    # same product as pass_at_k, over i in (n-c, n]  (Chen et al. 2021 eq. 1)
    factors = torch.where(i > n - c, 1.0 - k / i, torch.ones_like(i))
    estimate = 1.0 - factors.prod(dim=-1)
    estimate = torch.where(n - c.squeeze(-1) < k, torch.ones_like(estimate), estimate)
    return estimate.to(torch.float32)


# ----------------------------------------------------------------------------- pass@k training advantages

PASS_AT_K_BASELINES = ("mean", "leave_one_out")


def _max_weights(n: int, k: int) -> Tensor:
    """``[n]`` float64: the probability that the j-th largest of ``n`` values (j from 0) is the largest of a random
    ``k``-subset of them, ``C(n - 1 - j, k - 1) / C(n, k)``."""
    return torch.tensor([math.comb(n - 1 - j, k - 1) / math.comb(n, k) for j in range(n)], dtype=torch.float64)


def pass_at_k_advantages(rewards: Tensor, group_size: int, k: int, baseline: str = "mean", eps: float = 1e-6) -> Tensor:
    """``[N]`` advantages that credit each response with its share of its group's best-of-k reward.

    The value of a group for pass@k is the expected best reward of ``k`` of its responses drawn without
    replacement, ``E_S[max_{j in S} r_j]``; response i's is the same expectation over the draws that hold it.

    * ``baseline="mean"`` (Chen et al. 2025): ``A_i = (E_{S ∋ i}[max S] - E_S[max S]) / std_S(max S)``; for 0/1
      rewards ``(1 - mean) / std`` for a correct response and ``(1 - C(n_wrong - 1, k - 1) / C(n - 1, k - 1) -
      mean) / std`` for a wrong one, ``mean = 1 - C(n_wrong, k) / C(n, k)``, ``std = sqrt(mean (1 - mean))``.
      Needs ``k < group_size`` (with ``k = group_size`` every draw is the whole group: every advantage is 0).
    * ``baseline="leave_one_out"``: ``A_i = E_T[max(r_i, max T) - max T] / (std(r) + eps)`` over ``k - 1`` other
      responses ``T``: what response i adds to a draw (``k >= 2``). With ``k = group_size`` only a group's best
      response gets ``r_max - r_second``: verl's ``grpo_passk``.

    Groups whose rewards are all equal get 0."""
    if baseline not in PASS_AT_K_BASELINES:
        raise ValueError(f"baseline={baseline!r} is not valid; choose one of {list(PASS_AT_K_BASELINES)}")
    low = 2 if baseline == "leave_one_out" else 1
    high = group_size if baseline == "leave_one_out" else group_size - 1
    if not low <= k <= high:
        raise ValueError(f"pass@k advantages with baseline={baseline!r} need {low} <= k <= {high}, got k={k}")
    grouped = rewards.reshape(-1, group_size).to(torch.float64)
    n = group_size
    # the others of each response, sorted from the best: [P, n, n - 1]
    others = grouped.unsqueeze(1).expand(-1, n, -1)[:, ~torch.eye(n, dtype=torch.bool)].view(-1, n, n - 1)
    others = others.sort(dim=-1, descending=True).values
    mine = grouped.unsqueeze(-1)
    if k == 1:
        with_mine = grouped
    else:
        # E over k-1 others T of max(r_i, max T)  (the draws that hold i)
        with_mine = (torch.maximum(others, mine) * _max_weights(n - 1, k - 1).to(others)).sum(dim=-1)
    if baseline == "mean":
        best = grouped.sort(dim=-1, descending=True).values
        weights = _max_weights(n, k).to(best)
        value = (best * weights).sum(dim=-1, keepdim=True)
        variance = ((best**2 * weights).sum(dim=-1, keepdim=True) - value**2).clamp(min=0.0)
        # A_i = (E_{S∋i} max S - E_S max S) / std_S(max S)  (Chen et al. 2025, "Pass@k Training for Adaptively
        # Balancing Exploration and Exploitation", arXiv:2508.10751, analytical form; here for any rewards)
        std = variance.sqrt()  # 0 when every draw is as good: every advantage 0
        advantages = torch.where(std > 0, (with_mine - value) / (std + eps), 0.0)
    else:
        without_mine = (others * _max_weights(n - 1, k - 1).to(others)).sum(dim=-1)
        # A_i = E_T[max(r_i, max T) - max T] / (std + eps)  (verl 1dda039 core_algos
        # compute_grpo_passk_outcome_advantage: r_max - r_second_max at k = n)
        advantages = (with_mine - without_mine) / (grouped.std(dim=-1, keepdim=True) + eps)
    all_equal = grouped.amax(dim=-1, keepdim=True) == grouped.amin(dim=-1, keepdim=True)
    advantages = advantages.masked_fill(all_equal, 0.0)
    dtype = rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()
    return advantages.reshape(rewards.shape).to(dtype)

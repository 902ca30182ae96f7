"""Unbiased pass@k from n samples of which c are correct (Chen et al. 2021)."""

from __future__ import annotations

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

"""BEMA, bias-corrected exponential moving average of the weights (Block and Zhang 2025, "EMA Without the Lag:
Bias-Corrected Iterate Averaging Schemes", arXiv:2508.00180): an EMA of the iterates, whose lag behind the current
iterate is cancelled by a share of the distance travelled since a snapshot,

    beta_t  = max((lag + multiplier t)^-ema_power, min_ema_multiplier)
    alpha_t = (lag + multiplier t)^-bias_power
    EMA_t   = (1 - beta_t) EMA_{t-1} + beta_t theta_t
    BEMA_t  = EMA_t + alpha_t (theta_t - theta_0)

`ema_power` 0 leaves the EMA at the latest iterate (then BEMA_t = theta_t + alpha_t (theta_t - theta_0));
a large `bias_power` sends alpha_t to 0 (a plain EMA with a decaying rate).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def bema_coefficients(
    step: int, lag: float, multiplier: float, ema_power: float, bias_power: float, min_ema_multiplier: float = 0.0
) -> tuple[float, float]:
    """(alpha_t, beta_t) at `step` t (see the module docstring)."""
    base = lag + multiplier * step
    # beta_t = (rho + gamma t)^-kappa, alpha_t = (rho + gamma t)^-eta (Block and Zhang 2025, arXiv:2508.00180; TRL's
    # BEMACallback._ema_beta and _bema_alpha, huggingface/trl f2cd577)
    return base ** (-bias_power), max(base ** (-ema_power), min_ema_multiplier)


@torch.no_grad()
def bema_update_(
    theta: Sequence[Tensor],
    theta0: Sequence[Tensor],
    ema: Sequence[Tensor],
    bema: Sequence[Tensor],
    alpha: float,
    beta: float,
) -> None:
    """One BEMA update in place of `ema` and `bema` from the current iterate `theta` (each a list of tensors of the
    same shapes; `theta` is read in the buffers' dtype and device)."""
    for current, start, average, corrected in zip(theta, theta0, ema, bema, strict=True):
        current = current.detach().to(device=average.device, dtype=average.dtype)
        average.mul_(1 - beta).add_(current, alpha=beta)  # EMA_t = (1 - beta_t) EMA_{t-1} + beta_t theta_t
        torch.add(average, current - start, alpha=alpha, out=corrected)  # BEMA_t = EMA_t + alpha_t (theta_t - theta_0)


__all__ = ["bema_coefficients", "bema_update_"]

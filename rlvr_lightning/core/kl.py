"""Per-token estimators of KL(pi_theta || pi_ref) from tokens sampled from pi_theta.

Direction: p = pi_theta (the policy being trained, which generated the
tokens), q = pi_ref (the frozen reference). With the log-ratio
``d = log q - log p = ref_log_probs - log_probs`` (Schulman 2020, "Approximating
KL Divergence", http://joschu.net/blog/kl-approx.html):

* k1 = -d                 unbiased, high variance, can be negative;
* k2 = d^2 / 2            biased, low variance, >= 0;
* k3 = exp(d) - d - 1     unbiased, low variance, >= 0 (GRPO's KL term).

All three are 0 where p == q. Add ``beta * kl`` to the per-token loss to
penalise drift from the reference.
"""

from __future__ import annotations

import torch
from torch import Tensor

KL_ESTIMATORS = ("k1", "k2", "k3")
K3_LOG_RATIO_CLAMP = 20.0


def kl_estimate(log_probs: Tensor, ref_log_probs: Tensor, kind: str = "k3", clamp: float | None = None) -> Tensor:
    """Per-token KL estimate ``[N, T]``; optionally clamped to ``[-clamp, clamp]``.

    ``clamp=10`` reproduces verl's ``low_var_kl`` (k3 clamped to [-10, 10]). With a clamp, k3's
    log-ratio is clamped to [-20, 20] before ``exp`` as well: ``exp`` overflows float32 beyond
    d = 88.7 and the gradient of the clamped value would be 0 * inf = NaN.
    Gradient flows through ``log_probs``; ``ref_log_probs`` is normally detached.
    """
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kind!r}; valid choices: {', '.join(KL_ESTIMATORS)}")
    if clamp is not None and clamp <= 0:
        raise ValueError(f"clamp must be > 0 (or None), got {clamp}")
    d = ref_log_probs - log_probs  # log q - log p
    if kind == "k1":
        # k1 = -log(q/p)  (Schulman 2020 "Approximating KL Divergence")
        kl = -d
    elif kind == "k2":
        # k2 = (log(q/p))^2 / 2  (Schulman 2020 "Approximating KL Divergence")
        kl = 0.5 * d**2
    else:
        if clamp is not None:
            # clamp the log-ratio before exp  (verl core_algos.kl_penalty_forward "low_var_kl": [-20, 20])
            d = torch.clamp(d, -K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
        # k3 = q/p - log(q/p) - 1  (Schulman 2020; GRPO, Shao et al. 2024 DeepSeekMath eq. 4)
        kl = torch.exp(d) - d - 1.0
    if clamp is not None:
        # clip the estimate for stability  (verl core_algos.kl_penalty "low_var_kl" clamps to [-10, 10])
        kl = torch.clamp(kl, -clamp, clamp)
    return kl

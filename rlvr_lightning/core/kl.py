"""Per-token estimators of KL(pi_theta || pi_ref) from tokens sampled from pi_theta.

Direction: p = pi_theta (the policy being trained, which generated the
tokens), q = pi_ref (the frozen reference). With the log-ratio
``d = log q - log p = ref_log_probs - log_probs`` (Schulman 2020, "Approximating
KL Divergence", http://joschu.net/blog/kl-approx.html):

* ``K1``: -d                 unbiased, high variance, can be negative;
* ``K2``: d^2 / 2            biased, low variance, >= 0;
* ``K3``: exp(d) - d - 1     unbiased, low variance, >= 0 (GRPO's KL term).

All three are 0 where p == q. Add ``beta * kl`` to the per-token loss to
penalise drift from the reference. An estimator of your own subclasses
``KLEstimator`` and is named in the config by ``class_path``.

They estimate the KL on tokens sampled from pi_theta itself. Once the policy has moved away from the one
that sampled (pi_old: a second epoch, a later mini-batch, stale rollouts), ``K3IS`` (``k3_is``) weighs k3
by the importance ratio pi_theta / pi_old so that the estimate stays unbiased (DeepSeek-V3.2).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr_lightning.core.shorthands import from_shorthand

K3_LOG_RATIO_CLAMP = 20.0


class KLEstimator:
    """A per-token KL estimate; gradient flows through ``log_probs`` (``ref_log_probs`` is normally detached)."""

    #: True: ``estimate`` reads ``old_log_probs``, the log-probs of the policy that sampled (the update then
    #: computes them once the policy has moved)
    needs_old_log_probs: bool = False

    def __call__(self, log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
        """``[N, T]`` per-token estimate."""
        raise NotImplementedError

    def estimate(
        self, log_probs: Tensor, ref_log_probs: Tensor, clamp: float | None = None, old_log_probs: Tensor | None = None
    ) -> Tensor:
        """The estimate, clamped to ``[-clamp, clamp]`` when ``clamp`` is given (``clamp=10`` with ``K3`` is
        verl's ``low_var_kl``). ``old_log_probs`` (the sampling policy's; None: ``log_probs`` detached) is read
        only by estimators with ``needs_old_log_probs``."""
        if clamp is not None and clamp <= 0:
            raise ValueError(f"clamp must be > 0 (or None), got {clamp}")
        kl = self(log_probs, ref_log_probs)
        if clamp is not None:
            # clip the estimate for stability  (verl core_algos.kl_penalty "low_var_kl" clamps to [-10, 10])
            kl = torch.clamp(kl, -clamp, clamp)
        return kl

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class K1(KLEstimator):
    def __call__(self, log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
        # k1 = -log(q/p)  (Schulman 2020 "Approximating KL Divergence")
        return -(ref_log_probs - log_probs)


class K2(KLEstimator):
    def __call__(self, log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
        # k2 = (log(q/p))^2 / 2  (Schulman 2020 "Approximating KL Divergence")
        return 0.5 * (ref_log_probs - log_probs) ** 2


class K3(KLEstimator):
    """With a clamp, the log-ratio is clamped to [-20, 20] before ``exp`` as well: ``exp`` overflows float32
    beyond d = 88.7 and the gradient of the clamped value would be 0 * inf = NaN."""

    def __call__(self, log_probs: Tensor, ref_log_probs: Tensor, log_ratio_clamp: float | None = None) -> Tensor:
        d = ref_log_probs - log_probs  # log q - log p
        if log_ratio_clamp is not None:
            # clamp the log-ratio before exp  (verl core_algos.kl_penalty_forward "low_var_kl": [-20, 20])
            d = torch.clamp(d, -log_ratio_clamp, log_ratio_clamp)
        # k3 = q/p - log(q/p) - 1  (Schulman 2020; GRPO, Shao et al. 2024 DeepSeekMath eq. 4)
        return torch.exp(d) - d - 1.0

    def estimate(
        self, log_probs: Tensor, ref_log_probs: Tensor, clamp: float | None = None, old_log_probs: Tensor | None = None
    ) -> Tensor:
        if clamp is None:
            return self(log_probs, ref_log_probs)
        if clamp <= 0:
            raise ValueError(f"clamp must be > 0 (or None), got {clamp}")
        # clip the estimate for stability  (verl core_algos.kl_penalty "low_var_kl" clamps to [-10, 10])
        return torch.clamp(self(log_probs, ref_log_probs, K3_LOG_RATIO_CLAMP), -clamp, clamp)


class K3IS(K3):
    """k3 weighed by the importance ratio ``r_t = pi_theta / pi_old``: unbiased for KL(pi_theta || pi_ref) on tokens
    sampled from pi_old, whose expectation ``E_old[r_t k3_t] = E_theta[k3_t]`` is the KL, and whose gradient
    flows through the ratio too (as TRL's ``use_bias_correction_kl``), so that its expected gradient is
    grad KL(pi_theta || pi_ref) as well. At the sampling policy (``old_log_probs`` None, or equal) its value is
    k3's; its gradient ``k3_t grad log pi + grad k3_t`` is not k3's (whose expectation is the gradient of the
    other direction, KL(pi_ref || pi_theta)). The ratio's log is clamped to [-20, 20] before ``exp``, as the
    policy losses' is; ``clamp`` bounds k3 before the ratio multiplies it."""

    needs_old_log_probs = True

    def estimate(
        self, log_probs: Tensor, ref_log_probs: Tensor, clamp: float | None = None, old_log_probs: Tensor | None = None
    ) -> Tensor:
        old = log_probs.detach() if old_log_probs is None else old_log_probs.detach()
        ratio = torch.exp(torch.clamp(log_probs - old, -K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP))
        # KL_t = pi_theta(o_t) / pi_old(o_t) * k3_t  (DeepSeek-AI 2025, DeepSeek-V3.2 §3.1 "Unbiased KL Estimate";
        # checked against TRL f2cd577 trl/trainer/grpo_trainer.py, use_bias_correction_kl: per_token_kl * coef_1)
        return ratio * super().estimate(log_probs, ref_log_probs, clamp)


#: the names a config may give instead of a class
KL_ESTIMATORS: dict[str, type[KLEstimator]] = {"k1": K1, "k2": K2, "k3": K3, "k3_is": K3IS}


def kl_estimator(value: KLEstimator | str, option: str = "kl.estimator") -> KLEstimator:
    """``value`` itself, or the built-in estimator a shorthand names."""
    return from_shorthand(value, KLEstimator, KL_ESTIMATORS, option, "a class of your own")

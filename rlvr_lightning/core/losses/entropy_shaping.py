"""`EntropyShapedAdvantage`: a policy loss trained on advantages raised by the tokens' entropy.

Cheng et al. 2025, "Reasoning with Exploration: An Entropy Perspective" (arXiv:2506.14758 §3.2): each token's
advantage gains ``psi(H_t) = min(alpha sg(H_t), |A_t| / kappa)``, the entropy of the policy being trained at that
token (detached), capped at a fraction of the advantage so that it never flips its sign. The paper inserts it in
verl's actor update after the advantages are computed, for GRPO (alpha 0.4) and PPO (alpha 0.1), kappa 2.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr_lightning.core.losses.policy_loss_base import PolicyLoss, PolicyLossOutput, prepare_inputs
from rlvr_lightning.core.masked import masked_mean


def entropy_advantage_bonus(advantages: Tensor, entropy: Tensor, alpha: float, kappa: float) -> Tensor:
    """``[N, T]`` psi(H_t) = min(alpha H_t, |A_t| / kappa), H detached; ``advantages`` ``[N]`` or ``[N, T]``."""
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    # psi(H_t) = min(alpha * H_t^detach, |A_t| / kappa)  (Cheng et al. 2025, arXiv:2506.14758 eq. 5)
    return torch.minimum(alpha * entropy.detach(), adv.abs() / kappa)


class EntropyShapedAdvantage(PolicyLoss):
    """``loss`` on the advantages ``A_t + min(alpha sg(H_t), |A_t| / kappa)``, ``H_t`` the token's entropy under
    the policy being trained (the update computes it; Cheng et al. 2025, arXiv:2506.14758).

    The bonus is never negative, 0 where ``A_t = 0``, and below ``|A_t|`` (``kappa > 1``): a positive advantage
    grows, a negative one shrinks towards 0 without changing sign, most at uncertain tokens. Logged as
    ``entropy_bonus``, its mean over the real tokens. ``HighEntropyTokens`` may wrap it; it wraps no loss that
    picks tokens itself.

    Args:
        loss: the policy loss trained on the shaped advantages (a shorthand or a PolicyLoss).
        alpha: the entropy's weight (the paper's 0.4 with GRPO, 0.1 with PPO).
        kappa: the cap is ``|A_t| / kappa``; above 1 (the paper's 2).
    """

    reads_entropy = True

    def __init__(self, loss: PolicyLoss | str = "ppo_clip", alpha: float = 0.4, kappa: float = 2.0) -> None:
        from rlvr_lightning.core.losses.policy_losses import policy_loss  # the shorthands name this class too

        if not alpha >= 0.0:
            raise ValueError(f"EntropyShapedAdvantage: alpha must be >= 0, got {alpha}")
        if not kappa > 1.0:
            raise ValueError(
                f"EntropyShapedAdvantage: kappa must be > 1 (the cap |A|/kappa keeps A's sign), got {kappa}"
            )
        self.loss = policy_loss(loss, "loss.init_args.loss")
        if self.loss.selects_tokens or self.loss.reads_demonstrations:
            what = "picks tokens" if self.loss.selects_tokens else "reads demonstrations"
            raise ValueError(f"EntropyShapedAdvantage: {type(self.loss).__name__} {what}; wrap another loss")
        self.alpha, self.kappa = alpha, kappa

    @property
    def needs_old_log_probs(self) -> bool:
        return self.loss.needs_old_log_probs

    def check(self, aggregation: str) -> None:
        self.loss.check(aggregation)

    def __call__(self, log_probs, old_log_probs, advantages, mask, entropy: Tensor | None = None):
        shaped, bonus, inner = self._shaped(log_probs, old_log_probs, advantages, mask, entropy)
        return self._logged(self.loss(log_probs, old_log_probs, shaped, mask, **inner), bonus)

    def with_rollout_is(self, log_probs, old_log_probs, advantages, mask, weights, entropy: Tensor | None = None):
        shaped, bonus, inner = self._shaped(log_probs, old_log_probs, advantages, mask, entropy)
        out = self.loss.with_rollout_is(log_probs, old_log_probs, shaped, mask, weights, **inner)
        return self._logged(out, bonus)

    def _shaped(self, log_probs, old_log_probs, advantages, mask, entropy) -> tuple[Tensor, Tensor, dict]:
        if entropy is None:
            raise ValueError(
                "EntropyShapedAdvantage reads the tokens' entropies, which the update computes: pass entropy=, or "
                "train it through RLVRModule"
            )
        _, adv, m = prepare_inputs(log_probs, old_log_probs, advantages, mask)
        bonus = entropy_advantage_bonus(adv.expand(log_probs.shape), entropy, self.alpha, self.kappa)
        if m is not None:  # padding's entropy, whatever it is, reaches neither the loss nor its gradient
            bonus = bonus.masked_fill(~m, 0.0)
        # A_t^shaped = A_t + psi(H_t)  (Cheng et al. 2025 eq. 6)
        shaped = adv + bonus
        return shaped, bonus, ({"entropy": entropy} if self.loss.reads_entropy else {})

    @staticmethod
    def _logged(out: PolicyLossOutput, bonus: Tensor) -> PolicyLossOutput:
        out.extra_stats["entropy_bonus"] = masked_mean(bonus.to(out.ratio.dtype), out.mask)
        return out

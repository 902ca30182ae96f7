"""A policy loss in a file of its own: the policy gradient with the advantages clamped."""

import torch

from rlvr_lightning.core.losses.policy_losses import PolicyLoss, PolicyLossOutput


class ClippedPG(PolicyLoss):
    """-A * log pi(token), with A clamped to [-max_advantage, max_advantage]; on-policy (no ratio)."""

    needs_old_log_probs = False  # the update then skips computing old log-probs

    def __init__(self, max_advantage: float = 1.0):
        if max_advantage <= 0:
            raise ValueError(f"max_advantage must be > 0, got {max_advantage}")
        self.max_advantage = max_advantage

    def __call__(self, log_probs, old_log_probs, advantages, mask):
        clamped = advantages.clamp(-self.max_advantage, self.max_advantage)
        fraction = (clamped != advantages).float().mean()
        a = clamped.unsqueeze(-1) if clamped.dim() == 1 else clamped  # [N] outcome or [N, T] per-token
        loss = -a * log_probs  # [N, T], aggregated by the module's aggregation mode
        if mask is not None:
            loss = loss * mask
        return PolicyLossOutput(
            loss=loss,
            ratio=torch.ones_like(log_probs).detach(),
            mask=mask,
            extra_stats={"clamped_advantage_fraction": fraction.detach()},  # logged as train/clamped_advantage_fraction
        )

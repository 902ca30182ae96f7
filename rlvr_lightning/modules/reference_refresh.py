"""The KL reference's refresh: every `kl.refresh_every` rollout steps the reference takes the policy's weights
(`kl.mixup_alpha` < 1: TR-DPO's mixup), and with `kl.reset_optimizer` the optimizer forgets its state for the
policy's parameters, as ProRL resets (Liu et al. 2025, "ProRL: Prolonged Reinforcement Learning Expands Reasoning
Boundaries in Large Language Models", arXiv:2505.24864, sec. 3: "reinitializing the optimizer states" at each hard
reset of the reference): Adam's moments and step count start again, so its first steps after a reset are
bias-corrected afresh. The learning-rate schedule goes on.
"""

from __future__ import annotations

import torch
from torch import nn


def refresh_due(step: int, refresh_every: int | None) -> bool:
    """Whether the reference is refreshed before rollout step `step` (0-based; never before the first)."""
    return bool(refresh_every) and step > 0 and step % refresh_every == 0


def refresh_reference(module: nn.Module) -> bool:
    """Refresh `module.reference` from `module.policy` when `module.kl` says so at `module.rollout_step`; returns
    whether it did."""
    if module.reference is None or not refresh_due(module.rollout_step, module.kl.refresh_every):
        return False
    module.policy.update_reference(module.reference, alpha=module.kl.mixup_alpha)
    torch.clear_autocast_cache()  # no cast of the old reference weights may outlive the refresh
    if module.kl.reset_optimizer:
        forget_optimizer_state(module.trainer.optimizers, module.policy.parameters())
    return True


def forget_optimizer_state(optimizers, parameters) -> int:
    """Drop every optimizer's state for `parameters` (each starts again as at its first step); returns how many
    parameters had state."""
    params = list(parameters)
    dropped = 0
    for optimizer in optimizers:
        for param in params:
            dropped += optimizer.state.pop(param, None) is not None
    return dropped


__all__ = ["forget_optimizer_state", "refresh_due", "refresh_reference"]

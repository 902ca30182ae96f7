"""Which response of its group each response may learn from: self-distillation's demonstrations.

SDPO (Hübotter et al. 2026, "Reinforcement Learning via Self-Distillation", arXiv:2601.20802) re-prompts the
policy with a successful response of the same prompt and distils that feedback-conditioned prediction into the
policy on each response. A response's demonstration is the first response of its group, in row order, whose
reward reaches the success threshold; with ``exclude_self`` a response never demonstrates for itself (a
successful response then learns from another successful one, or not at all).
"""

from __future__ import annotations

import torch
from torch import Tensor


def demonstration_rows(reward: Tensor, group_index: Tensor, threshold: float, exclude_self: bool = True) -> Tensor:
    """``long[N]``: for each row the first row of its group (same ``group_index``) with ``reward >= threshold``,
    itself excluded when ``exclude_self``; -1 where there is none.

    ``reward`` ``float[N]``, ``group_index`` ``long[N]`` (any order: groups need not be contiguous)."""
    # TRL trl/experimental/sdpo/sdpo_trainer.py SuccessfulRolloutTeacherContextBuilder.build: successful[0] over
    # j in the group with rewards[j] >= success_reward_threshold, skipping j == i (dont_reprompt_on_self_success)
    candidates = (group_index.unsqueeze(1) == group_index.unsqueeze(0)) & (reward >= threshold).unsqueeze(0)
    if exclude_self:
        candidates &= ~torch.eye(reward.numel(), dtype=torch.bool, device=reward.device)
    first = candidates.to(torch.uint8).argmax(dim=1)  # argmax returns the first maximal index
    return torch.where(candidates.any(dim=1), first, torch.full_like(first, -1))

"""`AdvantageCallback`: turns a rollout's rewards into advantages. Exactly one per run.

Each class is a thin wrapper over an estimator in `rlvr_lightning.core.advantages`; the
module finds the callback in `trainer.callbacks` (GRPO's normalised advantage when none is
configured). A new estimator is one subclass overriding `compute`.
"""

from __future__ import annotations

from lightning.pytorch import Callback
from torch import Tensor

from rlvr_lightning.core import advantages as estimators
from rlvr_lightning.rollout import Rollout


class AdvantageCallback(Callback):
    """Base class: `compute(rollout) -> float[N]` (outcome advantages) or `float[N, T]` (per token)."""

    #: smallest group size the estimator is defined for (checked at start-up)
    min_group_size: int = 1

    def compute(self, rollout: Rollout) -> Tensor:
        raise NotImplementedError

    def check_group_size(self, group_size: int) -> None:
        if group_size < self.min_group_size:
            raise ValueError(
                f"{type(self).__name__} needs group_size >= {self.min_group_size} "
                f"(it compares responses to the same prompt), got group_size={group_size}"
            )


class RawRewardAdvantage(AdvantageCallback):
    """A = r: REINFORCE without a baseline."""

    def compute(self, rollout: Rollout) -> Tensor:
        return estimators.raw_advantages(rollout.reward, rollout.group_size)


class CenteredAdvantage(AdvantageCallback):
    """A = r - mean(group): Dr. GRPO; the lecture's "centered_rewards"."""

    min_group_size = 2

    def compute(self, rollout: Rollout) -> Tensor:
        return estimators.centered_advantages(rollout.reward, rollout.group_size)


class GroupNormalizedAdvantage(AdvantageCallback):
    """A = (r - mean(group)) / (std + eps): GRPO. `std_scope="batch"` scales by the batch std instead."""

    min_group_size = 2

    def __init__(self, eps: float = 1e-6, unbiased_std: bool = True, std_scope: str = "group") -> None:
        self.eps = eps
        self.unbiased_std = unbiased_std
        self.std_scope = std_scope
        estimators.normalized_advantages(Tensor([0.0, 1.0]), 2, std_scope=std_scope)  # validates std_scope now

    def compute(self, rollout: Rollout) -> Tensor:
        return estimators.normalized_advantages(
            rollout.reward, rollout.group_size, eps=self.eps, unbiased_std=self.unbiased_std, std_scope=self.std_scope
        )


class MaxOnlyAdvantage(AdvantageCallback):
    """Only the group's best responses keep their reward (CS336 lecture 17, "max_rewards")."""

    def compute(self, rollout: Rollout) -> Tensor:
        return estimators.max_only_advantages(rollout.reward, rollout.group_size)


class RLOOAdvantage(AdvantageCallback):
    """A = r - mean of the other responses to the same prompt (RLOO)."""

    min_group_size = 2

    def compute(self, rollout: Rollout) -> Tensor:
        return estimators.rloo_advantages(rollout.reward, rollout.group_size)


class BatchWhitenedAdvantage(AdvantageCallback):
    """A = (r - mean(batch)) / (std(batch) + eps): REINFORCE++."""

    def __init__(self, eps: float = 1e-8) -> None:
        self.eps = eps

    def compute(self, rollout: Rollout) -> Tensor:
        return estimators.batch_whitened_advantages(rollout.reward, rollout.group_size, eps=self.eps)

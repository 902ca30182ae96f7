"""`AdvantageCallback`: turns a rollout's rewards into advantages. Exactly one per run.

Each class is a thin wrapper over an estimator in `rlvr_lightning.core.advantage_estimators`; the
module finds the callback in `trainer.callbacks` (GRPO's normalised advantage when none is
configured). A new estimator is one subclass overriding `compute`.
"""

from __future__ import annotations

from lightning.pytorch import Callback
from torch import Tensor

from rlvr_lightning.core import advantage_estimators as estimators
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.option_domains import NON_NEGATIVE, PROBABILITY, check_ranges


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

    OPTION_RANGES = {"eps": NON_NEGATIVE}

    def __init__(self, eps: float = 1e-6, unbiased_std: bool = True, std_scope: str = "group") -> None:
        check_ranges(GroupNormalizedAdvantage.OPTION_RANGES, locals())
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


WHITEN_SCOPES = ("response", "token")


class BatchWhitenedAdvantage(AdvantageCallback):
    """A = (r - mean(batch)) / (std(batch) + eps): REINFORCE++.

    ``whiten="token"`` is verl's convention: per-token returns (discounted by ``gamma``) whitened over
    every response token, so long responses weigh more in the statistics; the advantage is then
    per token. The default whitens one reward per response (each response weighs the same).
    """

    OPTION_RANGES = {"eps": NON_NEGATIVE, "gamma": PROBABILITY}

    def __init__(self, eps: float = 1e-8, whiten: str = "response", gamma: float = 1.0) -> None:
        """
        Args:
            eps: added to the std (``whiten="response"``) or, as in verl, to the variance (``"token"``).
            whiten: ``response`` (ours) or ``token`` (verl's ``compute_reinforce_plus_plus_outcome_advantage``).
            gamma: discount of the returns over the response's tokens (needs ``whiten="token"``).
        """
        if whiten not in WHITEN_SCOPES:
            raise ValueError(f"whiten={whiten!r} is not valid; choose one of {WHITEN_SCOPES}")
        check_ranges(BatchWhitenedAdvantage.OPTION_RANGES, locals())
        if gamma != 1.0 and whiten != "token":
            raise ValueError(f"gamma={gamma} discounts per-token returns: it needs whiten='token'")
        self.eps = eps
        self.whiten = whiten
        self.gamma = gamma

    def compute(self, rollout: Rollout) -> Tensor:
        if self.whiten == "token":
            return estimators.token_whitened_returns(rollout.reward, rollout.response_mask, self.gamma, eps=self.eps)
        return estimators.batch_whitened_advantages(rollout.reward, rollout.group_size, eps=self.eps)

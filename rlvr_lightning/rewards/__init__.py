from rlvr_lightning.rewards.base import RewardCallback
from rlvr_lightning.rewards.sort import SortDistanceReward, SortInclusionOrderingReward

__all__ = ["RewardCallback", "SortDistanceReward", "SortInclusionOrderingReward"]

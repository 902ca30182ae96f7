from rlvr_lightning.rewards.base import RewardCallback
from rlvr_lightning.rewards.sort import SortAndStopReward, SortDistanceReward, SortInclusionOrderingReward

__all__ = ["RewardCallback", "SortAndStopReward", "SortDistanceReward", "SortInclusionOrderingReward"]

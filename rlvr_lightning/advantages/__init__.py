"""Advantage callbacks: turn a rollout's rewards into advantages; exactly one per run, listed under
`trainer.callbacks` (GRPO's group-normalised advantage when none is)."""

from rlvr_lightning.advantages.callbacks import (
    AdvantageCallback,
    BatchWhitenedAdvantage,
    CenteredAdvantage,
    CorrectnessAdvantage,
    GreedyBaselineAdvantage,
    GroupNormalizedAdvantage,
    MaxOnlyAdvantage,
    NormalizeThenSumAdvantage,
    OptimalTokenBaseline,
    PassAtKAdvantage,
    RawRewardAdvantage,
    RLOOAdvantage,
)
from rlvr_lightning.advantages.mixed import MixedAdvantage
from rlvr_lightning.advantages.optimal_value import OptimalValueAdvantage
from rlvr_lightning.advantages.smooth_standardized import SmoothStandardizedAdvantage
from rlvr_lightning.advantages.value_tracker import ValueTrackerAdvantage
from rlvr_lightning.advantages.weighted_reinforce import WeightedReinforceAdvantage

__all__ = [
    "AdvantageCallback",
    "BatchWhitenedAdvantage",
    "CenteredAdvantage",
    "CorrectnessAdvantage",
    "GreedyBaselineAdvantage",
    "GroupNormalizedAdvantage",
    "MaxOnlyAdvantage",
    "MixedAdvantage",
    "NormalizeThenSumAdvantage",
    "OptimalTokenBaseline",
    "OptimalValueAdvantage",
    "PassAtKAdvantage",
    "RLOOAdvantage",
    "RawRewardAdvantage",
    "SmoothStandardizedAdvantage",
    "ValueTrackerAdvantage",
    "WeightedReinforceAdvantage",
]

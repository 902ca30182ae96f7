"""Rewards: `RewardCallback`s that score a rollout's rows; a recipe lists them under `trainer.callbacks` and
their weighted sum is the reward."""

from rlvr_lightning.rewards.base import RewardCallback
from rlvr_lightning.rewards.calibration import CalibrationReward
from rlvr_lightning.rewards.code import CodeExecutionReward
from rlvr_lightning.rewards.confidence import ConfidenceReward, NegativeEntropyReward, SelfCertaintyReward
from rlvr_lightning.rewards.format import BoxedFormatReward, R1FormatReward
from rlvr_lightning.rewards.judge import GenerativeJudgeReward
from rlvr_lightning.rewards.language import LanguageConsistencyReward
from rlvr_lightning.rewards.length import CosineLengthReward, LengthReward, OverlongPenalty
from rlvr_lightning.rewards.log_likelihood import MeanLogProbReward
from rlvr_lightning.rewards.majority_vote import MajorityVoteReward
from rlvr_lightning.rewards.math import MathAccuracyReward
from rlvr_lightning.rewards.model_reward import ModelReward
from rlvr_lightning.rewards.reasoning_gym import ReasoningGymReward
from rlvr_lightning.rewards.repetition import RepetitionPenalty
from rlvr_lightning.rewards.reward_model import SequenceClassifierReward
from rlvr_lightning.rewards.sort import SortAndStopReward, SortDistanceReward, SortInclusionOrderingReward
from rlvr_lightning.rewards.text import ContainsReward
from rlvr_lightning.rewards.unlikeliness import UnlikelinessReward
from rlvr_lightning.rewards.verifiers_rubric import VerifiersRubricReward

__all__ = [
    "BoxedFormatReward",
    "CalibrationReward",
    "CodeExecutionReward",
    "ConfidenceReward",
    "ContainsReward",
    "CosineLengthReward",
    "GenerativeJudgeReward",
    "LanguageConsistencyReward",
    "LengthReward",
    "MajorityVoteReward",
    "MathAccuracyReward",
    "MeanLogProbReward",
    "ModelReward",
    "NegativeEntropyReward",
    "OverlongPenalty",
    "R1FormatReward",
    "ReasoningGymReward",
    "RepetitionPenalty",
    "RewardCallback",
    "SelfCertaintyReward",
    "SequenceClassifierReward",
    "SortAndStopReward",
    "SortDistanceReward",
    "SortInclusionOrderingReward",
    "UnlikelinessReward",
    "VerifiersRubricReward",
]

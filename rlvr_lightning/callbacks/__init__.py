"""Lightning callbacks and plugins of rlvr_lightning."""

from rlvr_lightning.callbacks.adaptive_entropy import AdaptiveEntropyControl
from rlvr_lightning.callbacks.bema import BEMA
from rlvr_lightning.callbacks.checkpointing import (
    AtomicCheckpointIO,
    CheckpointReadError,
    ResumeState,
    RolloutCheckpoint,
)
from rlvr_lightning.callbacks.environment import WriteEnvironment
from rlvr_lightning.callbacks.rollout_table import RolloutTableLogger

__all__ = [
    "AdaptiveEntropyControl",
    "AtomicCheckpointIO",
    "BEMA",
    "CheckpointReadError",
    "ResumeState",
    "RolloutCheckpoint",
    "RolloutTableLogger",
    "WriteEnvironment",
]

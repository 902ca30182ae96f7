"""Lightning callbacks and plugins of rlvr_lightning."""

from rlvr_lightning.callbacks.checkpointing import AtomicCheckpointIO, CheckpointReadError, ResumeState, RolloutCheckpoint

__all__ = ["AtomicCheckpointIO", "CheckpointReadError", "ResumeState", "RolloutCheckpoint"]

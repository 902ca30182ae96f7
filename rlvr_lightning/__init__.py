"""rlvr_lightning: reinforcement learning from verifiable rewards on PyTorch Lightning."""

from rlvr_lightning.rollout import Rollout

__all__ = ["Rollout"]
__version__ = "0.1.0"

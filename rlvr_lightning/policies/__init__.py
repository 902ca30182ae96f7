"""Policies. `HFPolicy` lives in `rlvr_lightning.policies.hf` (imports transformers on demand)."""

from rlvr_lightning.policies.base import Policy, PromptBatch, SamplingConfig
from rlvr_lightning.policies.toy_sort import ToySortPolicy

__all__ = ["Policy", "PromptBatch", "SamplingConfig", "ToySortPolicy"]

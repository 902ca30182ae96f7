"""Policies. `HFPolicy` lives in `rlvr_lightning.policies.hf` (imports transformers on demand); its
generation backends are importable from here (`VLLMGeneration` imports vLLM only when it starts)."""

from rlvr_lightning.generation.backend import GenerationBackend
from rlvr_lightning.generation.loop import KVCacheGeneration
from rlvr_lightning.generation.servers import ServerGeneration
from rlvr_lightning.generation.vllm_engine import VLLMGeneration
from rlvr_lightning.policies.base import Policy, PromptBatch, SamplingConfig
from rlvr_lightning.policies.toy_sort import ToySortPolicy

__all__ = [
    "GenerationBackend",
    "KVCacheGeneration",
    "Policy",
    "PromptBatch",
    "SamplingConfig",
    "ServerGeneration",
    "ToySortPolicy",
    "VLLMGeneration",
]

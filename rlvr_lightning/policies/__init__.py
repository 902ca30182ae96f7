"""Policies. `HFPolicy` lives in `rlvr_lightning.policies.hf` (imports transformers on demand); its
generation backends are importable from here (`VLLMGeneration` imports vLLM only when it starts)."""

from rlvr_lightning.policies.base import Policy, PromptBatch, SamplingConfig
from rlvr_lightning.policies.generation import KVCacheGeneration
from rlvr_lightning.policies.generation_backend import GenerationBackend
from rlvr_lightning.policies.server_generation import ServerGeneration
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.policies.vllm_generation import VLLMGeneration

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

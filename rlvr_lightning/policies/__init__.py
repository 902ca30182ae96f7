"""Policies: the models the training modules train (`HFPolicy`: a Hugging Face causal LM, optionally with LoRA;
`ToySortPolicy`: the sort task's small model; `SortTeacher`: a scripted teacher for distillation), behind the
`Policy` interface. `HFPolicy` imports transformers when it is built.

The generation backends live in `rlvr_lightning.generation`; the names below are also importable from here, so
that recipes written as `rlvr_lightning.policies.VLLMGeneration` keep working."""

from rlvr_lightning.generation import (
    GenerationBackend,
    KVCacheGeneration,
    SamplingConfig,
    ServerGeneration,
    VLLMGeneration,
)
from rlvr_lightning.policies.base import Policy, PromptBatch
from rlvr_lightning.policies.hf import HFPolicy
from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions, LoRAOptions, PromptOptions
from rlvr_lightning.policies.sort_teacher import SortTeacher
from rlvr_lightning.policies.toy_sort import ToySortPolicy

__all__ = [
    "GenerationBackend",
    "GenerationOptions",
    "HFModelOptions",
    "HFPolicy",
    "KVCacheGeneration",
    "LoRAOptions",
    "Policy",
    "PromptBatch",
    "PromptOptions",
    "SamplingConfig",
    "ServerGeneration",
    "SortTeacher",
    "ToySortPolicy",
    "VLLMGeneration",
]

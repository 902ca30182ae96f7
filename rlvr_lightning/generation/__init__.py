"""Generation backends: how a policy's responses are sampled. `KVCacheGeneration` (our decoding loop, the
default), `VLLMGeneration` (a colocated vLLM engine) and `ServerGeneration` (vLLM rollout servers) implement
`GenerationBackend`; a recipe names one under `model.init_args.policy.init_args.generation`."""

from rlvr_lightning.generation.backend import GenerationBackend
from rlvr_lightning.generation.loop import KVCacheGeneration
from rlvr_lightning.generation.output import GenerationOutput, StopStringChecker
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.generation.servers import ServerGeneration
from rlvr_lightning.generation.vllm_engine import VLLMGeneration

__all__ = [
    "GenerationBackend",
    "GenerationOutput",
    "KVCacheGeneration",
    "SamplingConfig",
    "ServerGeneration",
    "StopStringChecker",
    "VLLMGeneration",
]

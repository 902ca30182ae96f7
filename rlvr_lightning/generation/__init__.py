"""Generation backends: how a policy's responses are sampled. `KVCacheGeneration` (our decoding loop),
`StaticCacheGeneration` (the same loop over a static KV cache, its step compiled or a CUDA graph),
`VLLMGeneration` (a colocated vLLM engine) and `ServerGeneration` (vLLM rollout servers) implement
`GenerationBackend`; a recipe names one under `model.init_args.policy.init_args.generation.backend`. Without one,
`DeviceDefaultGeneration` decodes statically on a CUDA device and with our eager loop elsewhere."""

from rlvr_lightning.generation.backend import GenerationBackend
from rlvr_lightning.generation.device_default import DeviceDefaultGeneration
from rlvr_lightning.generation.loop import KVCacheGeneration
from rlvr_lightning.generation.output import GenerationOutput, StopStringChecker
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.generation.servers import ServerGeneration
from rlvr_lightning.generation.static_generation import StaticCacheGeneration
from rlvr_lightning.generation.vllm_engine import VLLMGeneration

__all__ = [
    "DeviceDefaultGeneration",
    "GenerationBackend",
    "GenerationOutput",
    "KVCacheGeneration",
    "SamplingConfig",
    "ServerGeneration",
    "StaticCacheGeneration",
    "StopStringChecker",
    "VLLMGeneration",
]

"""`DeviceDefaultGeneration`: the backend `HFPolicy` samples with when its config names none, chosen by the device at
each generation: `StaticCacheGeneration`'s decoding on a CUDA device (where launching a step's ~1,100 operators
from Python bounds the eager loop), our eager loop (`KVCacheGeneration`) elsewhere, where it is the faster one
and its sampled tokens stay those of earlier releases."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from rlvr_lightning.generation.loop import KVCacheGeneration
from rlvr_lightning.generation.output import GenerationOutput
from rlvr_lightning.generation.sampling_precision import SamplingDtype
from rlvr_lightning.generation.static_cache import static_cache_support
from rlvr_lightning.generation.static_generation import StaticCacheGeneration


class DeviceDefaultGeneration(KVCacheGeneration):
    """Our loop, decoding with a static cache and a graph-held step (`StaticCacheGeneration`, its defaults) when the
    prompts are on a CUDA device and the model has only full-attention layers, eagerly otherwise.

    Args:
        dtype: the precision it samples in, as `KVCacheGeneration`'s.
    """

    def __init__(self, dtype: SamplingDtype = "auto") -> None:
        super().__init__(dtype)
        self._static = StaticCacheGeneration(dtype)
        self._said_why_eager = False

    @staticmethod
    def why_eager(device: torch.device, model: nn.Module) -> str | None:
        """Why `model` decodes with the eager loop on `device`; None where it decodes statically: on a CUDA device, for
        a model with full-attention layers only that is not sharded."""
        from torch.distributed.fsdp import FSDPModule

        if device.type != "cuda":
            return f"{device} is not a CUDA device"
        if any(isinstance(module, FSDPModule) for module in model.modules()):
            return "the model is sharded by FSDP2, which gathers its weights into new storage for every rollout"
        return static_cache_support(model)

    @classmethod
    def decodes_statically(cls, device: torch.device, model: nn.Module) -> bool:
        return cls.why_eager(device, model) is None

    def say_why_eager(self, device: torch.device, model: nn.Module) -> None:
        """Warn once where a CUDA device decodes eagerly (the eager loop is several times slower there): the model is
        sharded, or it or transformers cannot hold a static cache."""
        if device.type != "cuda" or self._said_why_eager:
            return
        self._said_why_eager = True
        reason = self.why_eager(device, model)
        if reason is not None:
            message = f"DeviceDefaultGeneration decodes eagerly on {device}, not statically: {reason}"
            warnings.warn(message, stacklevel=3)

    def _decode(self, model, prompt_ids, prompt_mask, n, sampling, **kwargs) -> GenerationOutput:
        if self.decodes_statically(prompt_ids.device, model):
            return self._static._decode(model, prompt_ids, prompt_mask, n, sampling, **kwargs)
        self.say_why_eager(prompt_ids.device, model)
        return super()._decode(model, prompt_ids, prompt_mask, n, sampling, **kwargs)

    def sleep(self) -> None:
        self._static.sleep()

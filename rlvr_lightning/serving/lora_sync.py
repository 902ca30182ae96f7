"""What a LoRA policy sends to a vLLM engine at a weight push: the merged model, or only its adapter.

`lora_sync` (an option of `VLLMGeneration` and `ServerGeneration`):

* `merged` (the default): the adapter merged into copies of the base weights, every weight sent
  (`vllm_weights.named_weights`);
* `adapter`: the base weights once (the engine starts from dummy weights) and again only when they change, and at
  every push the trained adapter ("default") alone, as a PEFT directory (`adapter_model.safetensors`,
  `adapter_config.json`) that the engine loads in place under one LoRA name and samples with;
* `auto`: `adapter` where the policy is a peft LoRA policy and the engine can serve its adapter, else `merged`.

As SkyRL's disk-based LoRA sync and TRL's adapter-only sync do: the engine reads the PEFT directory (vLLM loads
adapters from a path; in-memory adapters need a patched vLLM). Where the adapter cannot be served (DoRA, modules
trained in full, an engine without LoRA) the push falls back to the merged weights and says why. The price of the
adapter: the engine decodes with LoRA kernels beside the base weights, slower than the merged model (about 1.9x
on vLLM's CPU build: docs/rollout_servers.md).
The backends hand `WeightPush.push` their two ways of pushing; vLLM is imported only to build its objects.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from rlvr_lightning.serving.vllm_weights import named_weights, tensor_versions

log = logging.getLogger(__name__)

LORA_SYNC_MODES = ("merged", "adapter", "auto")
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's `MaxLoRARanks` (vllm/config/lora.py)
ADAPTER_NAME = "rlvr-policy"  # the LoRA name the engine serves the adapter under
TRAINED_ADAPTER = "default"  # the policy's trained adapter ("reference" is the KL reference's, never sent)


def check_lora_sync(owner: str, value: Any) -> None:
    if value not in LORA_SYNC_MODES:
        raise ValueError(f"{owner} lora_sync={value!r} is not valid; choose one of {list(LORA_SYNC_MODES)}")


def lora_config(model: nn.Module) -> Any | None:
    """The peft `LoraConfig` of the model's trained adapter; None for a model without one."""
    configs = getattr(model, "peft_config", None)
    config = configs.get(TRAINED_ADAPTER) if isinstance(configs, dict) else None
    return config if config is not None and hasattr(config, "lora_alpha") else None


def adapter_unsupported(config: Any) -> str | None:
    """Why vLLM cannot serve this adapter as it is trained (None: it can)."""
    if getattr(config, "use_dora", False):
        return "the adapter is a DoRA adapter, which vLLM does not serve"
    if getattr(config, "modules_to_save", None):
        return f"modules {sorted(config.modules_to_save)} are trained in full beside the adapter"
    if getattr(config, "lora_bias", False) or getattr(config, "bias", "none") != "none":
        return "the adapter trains biases, which vLLM's LoRA does not load"
    if config.r > VLLM_LORA_RANKS[-1]:
        return f"its rank {config.r} exceeds vLLM's largest, {VLLM_LORA_RANKS[-1]}"
    return None


def engine_lora_rank(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM accepts that holds an adapter of `rank`."""
    return next(allowed for allowed in VLLM_LORA_RANKS if allowed >= rank)


def adapter_tensors(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
    """The trained adapter's tensors under PEFT's saved names (those of `peft.get_peft_model_state_dict`: the
    adapter's name dropped, `...q_proj.lora_A.default.weight` -> `...q_proj.lora_A.weight`), cast to `dtype`,
    sharded tensors gathered."""
    marker = f".{TRAINED_ADAPTER}."
    tensors = {}
    for name, tensor in model.state_dict().items():
        if ".lora_" not in name or marker not in name + ".":  # `lora_embedding_A.default` has no `.weight`
            continue
        tensor = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        tensors[(name + ".").replace(marker, ".", 1)[:-1]] = tensor.detach().to("cpu", dtype or tensor.dtype)
    return tensors


def adapter_config_dict(config: Any) -> dict[str, Any]:
    """The adapter's `adapter_config.json` (sets as sorted lists, as peft writes them)."""
    values = config.to_dict()
    return {key: sorted(value) if isinstance(value, set) else value for key, value in values.items()}


def tensor_bytes(tensors: Iterable[Tensor]) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


def counted(weights: Iterable[tuple[str, Tensor]], total: list[int]) -> Iterator[tuple[str, Tensor]]:
    """`weights` passed on one at a time, their bytes added to `total[0]`."""
    for name, tensor in weights:
        total[0] += tensor.numel() * tensor.element_size()
        yield name, tensor


def write_adapter(directory: str, tensors: dict[str, Tensor], config: Any) -> int:
    """Write the PEFT directory the engine loads (each file replaced whole, never seen half-written); the tensors'
    bytes."""
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    weights = os.path.join(directory, "adapter_model.safetensors")
    settings = os.path.join(directory, "adapter_config.json")
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, weights + ".tmp")
    os.replace(weights + ".tmp", weights)
    with open(settings + ".tmp", "w") as handle:
        json.dump(adapter_config_dict(config), handle)
    os.replace(settings + ".tmp", settings)
    return tensor_bytes(tensors.values())


def lora_request(path: str, load_inplace: bool = False) -> Any:
    """vLLM's request for the adapter in `path` (`load_inplace`: replace the one the engine holds)."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(ADAPTER_NAME, 1, path, load_inplace=load_inplace)


def engine_lora_unsupported(rank: int) -> str | None:
    """Why this process's vLLM cannot serve a LoRA adapter (None: it can)."""
    from vllm.platforms import current_platform

    try:
        current_platform.get_punica_wrapper()  # vLLM's LoRA kernels for this device
    except NotImplementedError:
        return f"vLLM's {current_platform.device_name} backend has no LoRA support"
    return None


def base_version(model: nn.Module) -> tuple:
    """Changes whenever a base (non-adapter) parameter is modified in place or replaced. Optimizer steps do not
    touch them (they are frozen), so no step count, unlike `vllm_weights.parameter_version`."""
    return tuple((id(p), *tensor_versions(p)) for name, p in model.named_parameters() if ".lora_" not in name)


class WeightPush:
    """One backend's pushes: which weights each sends (`lora_sync`), and the bytes of the last one."""

    def __init__(self, owner: str, mode: str) -> None:
        check_lora_sync(owner, mode)
        self.owner, self.mode = owner, mode
        self.adapter = False  # decided when the engine starts (`decide`)
        self.rank = 0  # the engine's max_lora_rank when the adapter is sent
        self.last_bytes = 0
        self._base_version: tuple | None = None

    def decide(self, model: nn.Module, engine_unsupported: Callable[[int], str | None]) -> bool:
        """Whether pushes send the adapter alone; `engine_unsupported(rank)` says why the engine cannot serve an
        adapter of that rank (None: it can). A fallback is logged for `auto`, warned about for `adapter`."""
        self.adapter, self._base_version = False, None
        config = lora_config(model)
        if self.mode == "merged" or (config is None and self.mode == "auto"):
            return False
        reason = "the policy has no LoRA adapter (lora_r = 0)" if config is None else adapter_unsupported(config)
        reason = reason or engine_unsupported(engine_lora_rank(config.r))
        if reason is not None:
            message = f"{self.owner} lora_sync={self.mode}: {reason}; pushing the merged weights instead"
            if self.mode == "adapter":
                warnings.warn(message, stacklevel=3)
            else:
                log.info(message)
            return False
        self.adapter, self.rank = True, engine_lora_rank(config.r)
        return True

    def push(
        self,
        model: nn.Module,
        dtype: torch.dtype | None,
        push_weights: Callable[[Iterator[tuple[str, Tensor]]], None],
        push_adapter: Callable[[], None],
        directory: str | None,
        engine_fresh: bool = False,
    ) -> int:
        """Push through `push_weights(named tensors)` and, for the adapter, `push_adapter()` once it is written to
        `directory` (None: gathered, not written: a trainer rank that only takes part in a sharded model's
        gathers); the bytes sent. `engine_fresh`: the engine holds none of the policy's weights (it started, or
        discarded them): the base weights are sent whether they changed or not."""
        sent = [0]
        if not self.adapter:
            push_weights(counted(named_weights(model, dtype), sent))
        else:
            version = base_version(model)
            if engine_fresh or version != self._base_version:
                push_weights(counted(named_weights(model, dtype, merge_lora=False), sent))
                self._base_version = version
            tensors = adapter_tensors(model, dtype)  # gathered on every rank of a sharded model
            if directory is not None:
                sent[0] += write_adapter(directory, tensors, lora_config(model))
            push_adapter()
        self.last_bytes = sent[0]
        return sent[0]

"""`WeightReceiver`: the worker extension a rollout server runs (`vllm serve --worker-extension-cls
rlvr_lightning.serving.server_worker.WeightReceiver`, which `rlvr serve` passes). vLLM mixes it into its
worker class; the trainer calls its methods through the server's `/collective_rpc` endpoint
(`client.py`, `weight_broadcast.py`). Loaded inside the vLLM process: torch and vLLM only.

Weights go through the worker's own `reload_weights` (in place, checkpoint names), as the colocated engine's
pushes do, so both backends load weights the same way; a LoRA adapter alone through the worker's `add_lora`
(in place). Each load records the version the trainer gave it.
"""

from __future__ import annotations

from typing import Any

import torch


class WeightReceiver:
    rlvr_weight_version: int = -1  # -1: the weights the server started with (dummy or from disk)
    rlvr_weight_loads: int = 0  # pushes received

    def rlvr_load_weights(self, path: str, version: int) -> int:
        """Load the safetensors file at `path` (the trainer wrote it); the version now held."""
        from safetensors import safe_open

        def tensors():
            with safe_open(path, framework="pt", device="cpu") as handle:
                for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    yield name, handle.get_tensor(name)

        self.reload_weights(weights_iterator=tensors(), is_checkpoint_format=True)
        return self._rlvr_loaded(version)

    def rlvr_max_lora_rank(self) -> int:
        """The largest LoRA rank the server serves (`--max-lora-rank`); 0 when it serves no LoRA adapters."""
        config = self.vllm_config.lora_config
        return int(config.max_lora_rank) if config is not None else 0

    def rlvr_load_lora(self, path: str, name: str, version: int) -> int:
        """Load the LoRA adapter in the PEFT directory `path` in place of the one the server's API registered
        under `name` (the only one it holds); the version now held."""
        from vllm.lora.request import LoRARequest

        held = sorted(self.list_loras())
        if len(held) != 1:
            raise RuntimeError(f"the server holds LoRA adapters {held}; expected the one registered as {name!r}")
        self.add_lora(LoRARequest(name, held[0], path, load_inplace=True))
        return self._rlvr_loaded(version)

    def rlvr_weight_version_held(self) -> int:
        return self.rlvr_weight_version

    def rlvr_weight_loads_received(self) -> int:
        """Pushes loaded since the server started (weights or adapter): one per update, whatever the trainer's
        number of processes."""
        return self.rlvr_weight_loads

    def _rlvr_loaded(self, version: int) -> int:
        self.rlvr_weight_version = version
        self.rlvr_weight_loads += 1
        return version

    def rlvr_dtype(self) -> str:
        """The dtype the server computes in ("float32", ...): the trainer pushes its weights in it."""
        return str(self.model_config.dtype).removeprefix("torch.")

    # ------------------------------------------------------------------ NCCL (GPU servers)

    def rlvr_world_size(self) -> int:
        """One entry per worker (collective_rpc answers a list): how many ranks this server adds to the group."""
        return 1

    def rlvr_init_communicator(self, host: str, port: int, world_size: int, rank_offset: int) -> None:
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.parallel_state import get_world_group
        from vllm.distributed.utils import StatelessProcessGroup

        rank = rank_offset + get_world_group().rank
        group = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size)
        self._rlvr_communicator = PyNcclCommunicator(group, device=self.device)

    def rlvr_receive_weights(self, metadata: list[tuple[str, str, list[int]]], version: int) -> int:
        """Receive each named tensor from the trainer's broadcast (rank 0) and load them; the version held."""
        received: list[tuple[str, Any]] = []
        for name, dtype, shape in metadata:
            tensor = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
            self._rlvr_communicator.broadcast(tensor, src=0, stream=torch.cuda.current_stream())
            received.append((name, tensor))
        torch.cuda.current_stream().synchronize()
        self.reload_weights(weights_iterator=iter(received), is_checkpoint_format=True)
        return self._rlvr_loaded(version)

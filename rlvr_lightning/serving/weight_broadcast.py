"""Weights from the trainer to every rollout server, versioned, each push within a time limit.

Two transports, chosen by device (`ServerGeneration(weight_transport=auto)`):

* `FileWeights` (CPU; any device): the trainer writes the weights once as a safetensors file in a directory
  the servers can read (default `/dev/shm`: shared memory on one node; a shared filesystem across nodes),
  then asks each server's worker extension to load it (`rlvr_load_weights`, vLLM's in-place
  `reload_weights`); the file is removed once every server has it.
* `NCCLWeights` (trainer on a GPU): TRL's scheme (`trl/scripts/vllm_serve.py`, `VLLMClient.update_named_param`):
  one NCCL group (vLLM's `StatelessProcessGroup` + `PyNcclCommunicator`) with the trainer as rank 0 and
  every server's worker after it; per push, each server is told the names, dtypes and shapes and receives
  the tensors by broadcast. A broadcast that a dead server never joins blocks forever, so the trainer's side
  runs on a thread and is waited for with a time limit (TRL PR #6913); on a time-out the group is
  unusable and the run stops with the error.

Either way every server answers with the version it now holds; a push that does not complete within
`timeout` seconds raises `RolloutServerError` naming the server.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import torch
from torch import Tensor

from rlvr_lightning.serving.client import RolloutServerClient, RolloutServerError


def _each_server(servers: Sequence[RolloutServerClient], call) -> list:
    """`call(server)` for every server at once; the first error raised."""
    with ThreadPoolExecutor(max_workers=max(len(servers), 1)) as pool:
        return list(pool.map(call, servers))


class FileWeights:
    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory or ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())

    def push(
        self,
        servers: Sequence[RolloutServerClient],
        weights: Iterable[tuple[str, Tensor]],
        version: int,
        timeout: float,
    ) -> None:
        from safetensors.torch import save_file

        tensors = file_tensors(weights)
        handle, path = tempfile.mkstemp(prefix=f"rlvr_weights_v{version}_", suffix=".safetensors", dir=self.directory)
        os.close(handle)
        try:
            save_file(tensors, path)
            del tensors
            _each_server(
                servers,
                lambda server: _check_version(
                    server,
                    server.collective_rpc(
                        "rlvr_load_weights", timeout, f"weight sync (version {version})", path=path, version=version
                    ),
                    version,
                ),
            )
        finally:
            os.unlink(path)

    def close(self) -> None:
        return None


class NCCLWeights:
    def __init__(self, host: str, port: int, device: torch.device) -> None:
        self.host, self.port, self.device = host, port, device
        self._communicator = None
        self._broken = False

    def _connect(self, servers: Sequence[RolloutServerClient], timeout: float) -> None:
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        sizes = _each_server(servers, lambda s: len(s.collective_rpc("rlvr_world_size", timeout, "world size query")))
        world_size = 1 + sum(sizes)
        offsets = [1 + sum(sizes[:i]) for i in range(len(servers))]

        def join(pair) -> None:
            server, offset = pair
            server.collective_rpc(
                "rlvr_init_communicator",
                timeout,
                "NCCL group start",
                host=self.host,
                port=self.port,
                world_size=world_size,
                rank_offset=offset,
            )

        pool = ThreadPoolExecutor(max_workers=len(servers))
        joined = [pool.submit(join, pair) for pair in zip(servers, offsets, strict=True)]
        group = StatelessProcessGroup.create(host=self.host, port=self.port, rank=0, world_size=world_size)
        self._communicator = PyNcclCommunicator(group, device=self.device)
        for future in joined:
            future.result(timeout=timeout)
        pool.shutdown(wait=False)

    def push(
        self,
        servers: Sequence[RolloutServerClient],
        weights: Iterable[tuple[str, Tensor]],
        version: int,
        timeout: float,
    ) -> None:
        if self._broken:
            raise RolloutServerError("the NCCL weight group broke at an earlier time-out; restart the run")
        if self._communicator is None:
            self._connect(servers, timeout)
        tensors = [(name, tensor.to(self.device).contiguous()) for name, tensor in weights]
        metadata = [(name, str(t.dtype).removeprefix("torch."), list(t.shape)) for name, t in tensors]
        pool = ThreadPoolExecutor(max_workers=len(servers) + 1)
        receivers = [
            pool.submit(
                lambda s: _check_version(
                    s,
                    s.collective_rpc(
                        "rlvr_receive_weights",
                        timeout,
                        f"weight sync (version {version})",
                        metadata=metadata,
                        version=version,
                    ),
                    version,
                ),
                server,
            )
            for server in servers
        ]

        def broadcast() -> None:
            stream = torch.cuda.current_stream(self.device)
            for _, tensor in tensors:
                self._communicator.broadcast(tensor, src=0, stream=stream)
            stream.synchronize()

        sender = pool.submit(broadcast)
        try:
            sender.result(timeout=timeout)
            for receiver in receivers:
                receiver.result(timeout=timeout)
        except FutureTimeout:
            self._broken = True
            late = [s.address for s, r in zip(servers, receivers, strict=True) if not r.done()] or ["(the broadcast)"]
            raise RolloutServerError(
                f"rollout server {', '.join(late)}: weight sync (version {version}) "
                f"did not complete within {timeout:g} s"
            ) from None
        finally:
            pool.shutdown(wait=False)

    def close(self) -> None:
        self._communicator = None


def file_tensors(weights: Iterable[tuple[str, Tensor]]) -> dict[str, Tensor]:
    """The named tensors as CPU tensors safetensors can write: a tensor sharing memory with an earlier one (tied
    embeddings: `embed_tokens` and `lm_head`) is copied, since safetensors refuses shared memory."""
    tensors, storages = {}, set()
    for name, tensor in weights:
        tensor = tensor.detach().cpu().contiguous()
        storage = tensor.untyped_storage().data_ptr()
        tensors[name] = tensor.clone() if storage in storages else tensor
        storages.add(storage)
    return tensors


def _check_version(server: RolloutServerClient, results: list, version: int) -> None:
    """Every worker of `server` answers the version it now holds (vLLM's endpoint returns it as text)."""
    if not results or any(str(result) != str(version) for result in results):
        raise RolloutServerError(
            f"rollout server {server.address}: weight sync answered {results}, expected [{version}]"
        )


def transport_for(name: str, device: torch.device, directory: str | None, host: str, port: int):
    """The transport `name` ("auto": NCCL when the trainer is on a GPU, else a file)."""
    if name == "auto":
        name = "nccl" if device.type == "cuda" else "file"
    if name == "nccl":
        return NCCLWeights(host, port, device)
    return FileWeights(directory)


def push_adapter(
    servers: Sequence[RolloutServerClient], path: str, name: str, version: int, timeout: float, registered: set[str]
) -> None:
    """Every server loads the LoRA adapter in the PEFT directory `path` in place of the one it holds and answers
    the version. The first time, a server's OpenAI API registers the adapter under `name` (vLLM's
    `/v1/load_lora_adapter`, which `VLLM_ALLOW_RUNTIME_LORA_UPDATING` opens), so that requests can name it; the
    in-place reloads after are the workers' own (`rlvr_load_lora`): a registration with `load_inplace` would keep
    that flag on every request."""

    def load(server: RolloutServerClient) -> None:
        if server.address not in registered:
            try:
                server.call("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path}, timeout, "adapter load")
            except RolloutServerError as error:
                if "already been loaded" not in str(error):  # a server kept from an earlier run holds it already
                    raise
            registered.add(server.address)
        answer = server.collective_rpc(
            "rlvr_load_lora", timeout, f"weight sync (version {version})", path=path, name=name, version=version
        )
        _check_version(server, answer, version)

    _each_server(servers, load)

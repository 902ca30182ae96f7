"""`ServerGeneration`: rollouts from vLLM servers on their own devices or nodes (`rlvr serve`), addressed by a
list of `host:port`.

    policy:
      class_path: rlvr_lightning.policies.hf.HFPolicy
      init_args:
        model:
          name_or_path: smollm2-135m-instruct
        generation:
          backend:
            class_path: rlvr_lightning.policies.ServerGeneration
            init_args: {servers: [node1:8000, node2:8000]}

Requests go to vLLM's OpenAI completions endpoint, one per prompt (its `n` responses), spread over the servers
in turn and sent at once: token ids in (`prompt` as a list of ids), token ids and the chosen tokens'
log-probs out (`return_token_ids`, `logprobs: 0`); text is never re-tokenised. The sampling parameters and
the per-request seeds are the colocated engine's (`vllm_sampling.py`, seeds from torch's generator), so
`VLLMGeneration` and one server sample the same tokens from the same weights. Multi-turn rollouts (tools,
the thinking budget) work unchanged: `segmented_generation.py` calls `generate` round after round.

Weights. Before a generation whose weights changed (optimizer steps or parameter versions tell, as for the
colocated engine), the trainer pushes them to every server (`weight_broadcast.py`: a shared-memory file on a
CPU, NCCL from a GPU) and counts a version; `engine/weight_version` in the generation stats is the version
the rollout was sampled with, and every server confirms it holds it. A LoRA policy sends its adapter alone
where the servers serve LoRA adapters (`lora_sync`, `lora_sync.py`; `rlvr serve --max-lora-rank`): a PEFT
directory in `weight_dir`, loaded in place by every server, whose requests then name the adapter.

A trainer of several processes (DDP, FSDP2; one node or several) shares the servers: each rank sends its own
prompts (spread from server `rank mod S` on), and only rank 0 pushes. Every rank takes part in gathering a
sharded model's weights, and waits for rank 0's push to complete (or fail: the error reaches every rank)
before it samples, so the servers load each update once and no rank samples from stale weights.

Faults never hang: each server must answer `/health` within `startup_timeout_s` at the first use, each
generation request within `request_timeout_s`, each weight push within `sync_timeout_s`. Otherwise, or when a
response comes back cut short (a stopping server answers with vLLM's finish_reason "abort"), a
`RolloutServerError` names the server and what did not complete, and the run stops (its last checkpoint is
intact; `--ckpt_path last` resumes).
"""

from __future__ import annotations

import shutil
import tempfile
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, Literal

import torch
from torch import nn

from rlvr_lightning.generation.compute_dtype import compute_dtype
from rlvr_lightning.generation.engine_backend import Completion, EngineGeneration, completion
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import Range
from rlvr_lightning.serving.client import RolloutServerClient, RolloutServerError
from rlvr_lightning.serving.lora_sync import ADAPTER_NAME
from rlvr_lightning.serving.vllm_weights import count_optimizer_steps
from rlvr_lightning.serving.weight_broadcast import FileWeights, push_adapter, transport_for

TRANSPORTS = ("auto", "file", "nccl")


@documented_options
class ServerGeneration(EngineGeneration):
    def __init__(
        self,
        servers: Annotated[list[str], Option('the rollout servers, "host:port" each (`rlvr serve` started them).')],
        request_timeout_s: Annotated[
            float, Option("the longest a generation request may take.", Range(0, low_open=True))
        ] = 600.0,
        sync_timeout_s: Annotated[
            float, Option("the longest a weight push to all servers may take.", Range(0, low_open=True))
        ] = 300.0,
        startup_timeout_s: Annotated[
            float,
            Option(
                "the longest to wait for every server to answer at the first use (they may be loading).",
                Range(0, low_open=True),
            ),
        ] = 600.0,
        weight_transport: Annotated[
            Literal["auto", "file", "nccl"],
            Option('"auto": NCCL when the trainer is on a GPU, else "file" (a safetensors file in `weight_dir`).'),
        ] = "auto",
        weight_dir: Annotated[
            str | None,
            Option('where "file" writes the weights; the servers must read the same path (default /dev/shm).'),
        ] = None,
        nccl_host: Annotated[
            str, Option("the trainer's address the servers' workers connect to for NCCL (\"nccl\" only).")
        ] = "127.0.0.1",
        nccl_port: Annotated[
            int, Option("the port of that group's rendezvous.", Range(1, 65535, integer=True))
        ] = 51216,
        max_concurrent_requests: Annotated[
            int, Option("requests in flight at once, over all servers.", Range(1, integer=True))
        ] = 64,
        lora_sync: Annotated[
            Literal["merged", "adapter", "auto"],
            Option(
                'what a LoRA policy pushes: "merged" (the merged weights), "adapter" (the adapter '
                "alone, to servers started with `--max-lora-rank`; they then decode with LoRA kernels, "
                'slower), "auto" (the adapter where the servers serve it).'
            ),
        ] = "merged",
    ) -> None:
        super().__init__("ServerGeneration", lora_sync)  # checks lora_sync
        check_options(ServerGeneration, locals())
        if not servers:
            raise ValueError(
                "ServerGeneration servers=[] is empty; give at least one host:port (e.g. [localhost:8000])"
            )
        if weight_transport not in TRANSPORTS:
            raise ValueError(
                f"ServerGeneration weight_transport={weight_transport!r} is not valid; choose one of {list(TRANSPORTS)}"
            )
        self.clients = [RolloutServerClient(address) for address in servers]  # checks each address
        self.servers = list(servers)
        self.request_timeout_s = request_timeout_s
        self.sync_timeout_s = sync_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.weight_transport = weight_transport
        self.weight_dir = weight_dir
        self.nccl_host, self.nccl_port = nccl_host, nccl_port
        self.max_concurrent_requests = max_concurrent_requests
        self.weight_version = 0  # pushes made; the servers start at -1 (their own weights)
        self._started = False
        self._model_name: str | None = None
        self._transport: Any = None
        self._adapter_dir: str | None = None
        self._adapter_registered: set[str] = set()  # servers whose API serves the adapter's name
        self._rank, self._world_size = 0, 1  # the trainer's process (torch.distributed), read at the first use

    # ------------------------------------------------------------------ the seam

    def _prepare(self, model: nn.Module, tokenizer: Any) -> dict[str, float]:
        start_seconds = self._start(model)
        push_seconds = self._push_if_changed(model) if self.push_on_generate else 0.0
        # the version these rollouts are sampled with (an asynchronous driver may push during the requests)
        version = float(self.weight_version)
        return {
            "engine/start_seconds": start_seconds,
            "engine/weight_push_seconds": push_seconds,
            "engine/weight_version": version,
        }

    def _complete_all(self, model, prompt_token_ids, requests):
        model_name = ADAPTER_NAME if self._weights.adapter else self._model_name
        bodies = [
            {
                "model": model_name,
                "prompt": list(prompt),
                **request,
                "return_token_ids": True,
                "skip_special_tokens": False,
            }
            for prompt, request in zip(prompt_token_ids, requests, strict=True)
        ]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrent_requests, len(bodies))) as pool:
            answers = list(pool.map(self._complete, range(len(bodies)), bodies))
        return [self._completions(client, answer, requests[0]["n"]) for client, answer in answers]

    @staticmethod
    def _completions(client: RolloutServerClient, answer: dict[str, Any], n: int) -> list[Completion]:
        choices = sorted(answer["choices"], key=lambda choice: choice["index"])
        if len(choices) != n:
            raise RolloutServerError(f"rollout server {client.address} answered {len(choices)} responses, not {n}")
        completions = []
        for choice in choices:
            tokens = list(choice["token_ids"])
            log_probs = (choice.get("logprobs") or {}).get("token_logprobs") or [0.0] * len(tokens)
            ended = choice.get("finish_reason"), choice.get("stop_reason")
            source = f"rollout server {client.address}"
            completions.append(completion(tokens, log_probs, *ended, source, RolloutServerError))
        return completions

    def push_weights(self, model: nn.Module, tokenizer: Any) -> float:
        self._start(model)
        return self._push_if_changed(model)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.update(_started=False, _transport=None, _pushed_version=None, _adapter_dir=None)  # nor connections
        return state

    # ------------------------------------------------------------------ servers

    def _complete(self, index: int, body: dict[str, Any]) -> tuple[RolloutServerClient, dict[str, Any]]:
        client = self.clients[(index + self._rank) % len(self.clients)]
        what = f"generation request (prompt {index}, up to {body['max_tokens']} tokens)"
        return client, client.call("/v1/completions", body, self.request_timeout_s, what)

    def _start(self, model: nn.Module) -> float:
        """At the first use: every server answers, serves one model, and computes in one dtype."""
        if self._started:
            return 0.0
        started = time.perf_counter()
        self._rank, self._world_size = trainer_rank()
        for client in self.clients:
            client.wait_until_ready(self.startup_timeout_s)
        names, dtypes = set(), set()
        for client in self.clients:
            listed = client.call("/v1/models", None, self.request_timeout_s, "model listing")
            names.add(listed["data"][0]["id"])
            dtypes.update(client.collective_rpc("rlvr_dtype", self.request_timeout_s, "dtype query"))
        if len(names) != 1 or len(dtypes) != 1:
            raise RolloutServerError(
                f"rollout servers {', '.join(self.servers)} serve models {sorted(names)} in dtypes {sorted(dtypes)}; "
                "every server must serve the same model in the same dtype"
            )
        self._model_name = names.pop()
        self._engine_dtype = getattr(torch, dtypes.pop())
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self._trainer_dtype = compute_dtype(base)
        device = next(model.parameters()).device
        if self._rank == 0:  # the pushing rank
            self._transport = transport_for(
                self.weight_transport, device, self.weight_dir, self.nccl_host, self.nccl_port
            )
        self._pushed_version = None
        unsupported = lambda rank: _lora_unsupported(self.clients, rank, self.request_timeout_s)  # noqa: E731
        if self._weights.decide(model, unsupported) and self._rank == 0:
            self._adapter_dir = tempfile.mkdtemp(prefix="rlvr_lora_", dir=FileWeights(self.weight_dir).directory)
            weakref.finalize(self, shutil.rmtree, self._adapter_dir, True)
            self._adapter_registered = set()
        count_optimizer_steps()
        self._started = True
        return time.perf_counter() - started

    def _push(self, model: nn.Module, fresh: bool) -> None:
        self.weight_version += 1
        error = None
        try:
            if self._rank == 0:
                self._send(model, self.weight_version, fresh)
            else:  # its part of a sharded model's gathers
                self._weights.push(model, self._engine_dtype, _drain, lambda: None, None, fresh)
        except Exception as exc:
            error = exc
        if self._world_size > 1:  # every rank waits for rank 0's push; its failure stops them all
            failure = rank_0_outcome(error)
            if failure is not None and error is None:
                raise RolloutServerError(f"rank 0's weight push failed: {failure}")
        if error is not None:
            raise error

    def _send(self, model: nn.Module, pushed: int, fresh: bool) -> None:
        timeout = self.sync_timeout_s

        def send(weights):
            try:
                self._transport.push(self.clients, weights, pushed, timeout)
            finally:  # after a failure, the rest of a sharded model's gathers, which the other ranks are in
                _drain(weights)

        self._weights.push(
            model,
            self._engine_dtype,
            send,
            lambda: push_adapter(
                self.clients, self._adapter_dir, ADAPTER_NAME, pushed, timeout, self._adapter_registered
            ),
            self._adapter_dir,
            fresh,
        )
        for client in self.clients:  # cached prefixes were computed with the old weights
            client.call("/reset_prefix_cache", {}, timeout, "prefix cache reset")


def trainer_rank() -> tuple[int, int]:
    """This process's rank and the number of the trainer's processes (0, 1 without torch.distributed)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def rank_0_outcome(error: BaseException | None) -> str | None:
    """Rank 0's push error (as text) on every rank; None where it succeeded. A collective: every rank calls it."""
    message = [f"{type(error).__name__}: {error}" if error is not None else None]
    torch.distributed.broadcast_object_list(message, src=0)
    return message[0]


def _drain(weights) -> None:
    for _ in weights:
        pass


def _lora_unsupported(clients: list[RolloutServerClient], rank: int, timeout: float) -> str | None:
    """Why the servers cannot serve an adapter of `rank` (None: they can)."""
    for client in clients:
        answers = client.collective_rpc("rlvr_max_lora_rank", timeout, "LoRA rank query")  # 0: LoRA off
        held = min((int(answer) for answer in answers), default=0)  # vLLM's endpoint answers text
        if held < rank:
            return (
                f"rollout server {client.address} serves LoRA adapters up to rank {held}, not "
                f"{rank}; start it with `rlvr serve ... --max-lora-rank {rank}`"
            )
    return None

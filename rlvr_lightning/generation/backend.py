"""The generation seam of `HFPolicy`: prompt token ids in, sampled responses out.

The implementations, chosen in YAML under the policy's `generation` option:

* `KVCacheGeneration`: our own batched loop over the training model
  (in `rlvr_lightning.generation.loop`): one prefill per distinct prompt, finished rows dropped,
  no second copy of the weights. The CPU default.
* `StaticCacheGeneration` (`rlvr_lightning.generation.static_generation`): the same sampling over a static
  KV cache, its decoding step compiled or captured as a CUDA graph. The CUDA default.
* `VLLMGeneration` (`rlvr_lightning.generation.vllm_engine`): a vLLM engine colocated in the
  training process, fed the policy's weights whenever they changed.

Either one returns a `GenerationOutput` (response ids and mask, truncation and stop-string flags, the
sampling log-probs of the chosen tokens); the policy turns it into a `Rollout`. The module never
knows which backend ran.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from rlvr_lightning.generation.output import GenerationOutput
from rlvr_lightning.generation.sampling_config import SamplingConfig


class GenerationBackend(ABC):
    """Samples `n` responses per prompt from a Hugging Face causal LM."""

    #: True for a backend that samples from its own copy of the weights (an engine), which `push_weights` refreshes
    owns_weights = False
    #: whether `generate` first pushes weights that changed since the last push (an owner of weights only). An
    #: asynchronous driver that pushes between updates turns it off while a generation runs beside an update.
    push_on_generate = True

    @property
    def exact_log_probs(self) -> bool:
        """Whether the sampling log-probs equal the trainer's to float precision (fp32, the unfiltered
        distribution at the sampling temperature), so the trainer may use them as old log-probs."""
        return False

    @property
    def log_probs_renormalised(self) -> bool:
        """Whether the last generation's log-probs were renormalised over the tokens top-k/top-p kept (vLLM's
        processed log-probs) instead of the unfiltered distribution the trainer scores. Such log-probs are not
        recorded as sampling log-probs: their ratio to the trainer's would carry the kept probability mass."""
        return False

    @abstractmethod
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
        """`n` responses to each prompt; rows `i*n .. i*n+n-1` belong to prompt `i`.

        `model` is the policy's model (with its LoRA adapter, if any); `sampling.min_new_tokens` is
        already the larger of the policy's and the sampling config's. `max_new_tokens`, if given, caps the
        responses of each prompt on their own (each at most `sampling.max_new_tokens`; multi-turn rollouts
        continue rows with different budgets left). Random draws come from `generator` (None: torch's
        global generator)."""

    def push_weights(self, model: nn.Module, tokenizer: Any) -> float:
        """Copy `model`'s weights into the backend's own copy if they changed; the seconds it took. A backend
        that samples from the model it is given (`owns_weights` False) has nothing to push."""
        return 0.0

    def sleep(self) -> None:
        """Free what the backend holds between rollouts (the update runs next). An optional hook: by
        default a backend holds nothing between rollouts, so there is nothing to free."""
        return None


def response_tensors(
    responses: Sequence[Sequence[int]],
    log_probs: Sequence[Sequence[float]] | None,
    pad_token_id: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded `response_ids long[N, T]`, `response_mask float[N, T]` and `log_probs float[N, T]`
    (zeros where masked or when none are given) from per-row token lists, T = the longest row (>= 1)."""
    width = max([len(r) for r in responses] + [1])
    ids = torch.full((len(responses), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(responses), width), dtype=torch.float32)
    values = torch.zeros((len(responses), width), dtype=torch.float32)
    for row, tokens in enumerate(responses):
        if tokens:
            ids[row, : len(tokens)] = torch.as_tensor(list(tokens), dtype=torch.long)
            mask[row, : len(tokens)] = 1.0
            if log_probs is not None:
                values[row, : len(tokens)] = torch.as_tensor(list(log_probs[row]), dtype=torch.float32)
    return ids.to(device), mask.to(device), values.to(device)

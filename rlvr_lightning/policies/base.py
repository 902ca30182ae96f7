"""The `Policy` interface: what the training modules need from a model.

A batch of prompts, as the data module yields it, is a dict:

    {"prompt": list[P], "metadata": list[dict]}

where each prompt is whatever the policy understands (token ids for the toy sort policy,
text or chat messages for language models) and each metadata dict carries the task's
per-prompt facts (ground truth, test cases, ...). `sample` repeats every prompt `n` times
into contiguous groups and returns a `Rollout` (shapes documented in `rlvr_lightning.rollout`).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.option_domains import NON_NEGATIVE_INT, POSITIVE_INT, Range, check_ranges

PromptBatch = dict[str, list[Any]]


def compute_device(module: nn.Module) -> torch.device:
    """The device `module` computes on: the one `set_compute_device` recorded (a training module records its
    strategy's root device), else its first parameter's (CPU without parameters).

    The two differ under FSDP2 with CPU offload: the sharded parameters stay in CPU memory while every
    forward runs on the GPU, so tensors built for a forward must not follow the parameters."""
    device = getattr(module, "_compute_device", None)
    if device is not None:
        return device
    first = next(module.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def set_compute_device(module: nn.Module, device: torch.device) -> None:
    """Record `device` as where `module` and every submodule compute (`compute_device` reads it)."""
    for submodule in module.modules():
        submodule._compute_device = torch.device(device)


@dataclass
class SamplingConfig:
    """How responses are sampled. Log-probs are computed at the same temperature.

    Args:
        temperature: the sampling temperature (> 0); the trainer's log-probs use the same one.
        do_sample: false: greedy decoding (evaluation).
        top_p: nucleus sampling's probability mass (1: off).
        top_k: sample among the k most likely tokens (0: off).
        max_new_tokens: the most tokens a response may have.
        min_new_tokens: EOS is not sampled before this many tokens (equal-length benchmarks).
        stop_strings: a response ends after any of these strings.
    """

    temperature: float = 1.0
    do_sample: bool = True
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    min_new_tokens: int = 0
    stop_strings: list[str] = field(default_factory=list)

    OPTION_RANGES: ClassVar[dict[str, Range]] = {
        "temperature": Range(0, low_open=True),
        "top_p": Range(0, 1, low_open=True),
        "top_k": NON_NEGATIVE_INT,
        "max_new_tokens": POSITIVE_INT,
        "min_new_tokens": NON_NEGATIVE_INT,
    }

    def __post_init__(self) -> None:
        check_ranges(self.OPTION_RANGES, vars(self), prefix="sampling.")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(f"sampling.min_new_tokens must be in [0, max_new_tokens], got {self.min_new_tokens}")


class Policy(nn.Module, ABC):
    """A trainable policy: samples rollouts and scores their tokens."""

    #: optional facts about the last `sample` call (lengths, tokens/s, ...), logged by the trainer
    last_generation_stats: dict[str, float]

    @abstractmethod
    def sample(
        self, batch: PromptBatch, n: int, sampling: SamplingConfig, generator: torch.Generator | None = None
    ) -> Rollout:
        """`n` responses per prompt, without gradients, as one `Rollout` of `len(prompts) * n` rows.

        Random draws come from `generator` (None: torch's global generator); asynchronous rollouts
        (`RLVRModule(rollout_staleness=1)`) sample in a background thread with a generator of their own.

        A policy whose sampling forward is the training forward may fill `rollout.old_log_probs` (at
        `sampling.temperature`), which saves the trainer a forward pass when it needs them. A policy that
        samples with a separate generator (a KV-cache loop, an inference engine) records what the generator
        computed in `rollout.sampling_log_probs` instead; the trainer uses them as old log-probs only when
        `sampling_log_probs_exact` says so.
        """

    @property
    def sampling_log_probs_exact(self) -> bool:
        """Whether `rollout.sampling_log_probs` equal the trainer's log-probs (may serve as old log-probs)."""
        return False

    @abstractmethod
    def token_log_probs(
        self, rollout: Rollout, temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """Differentiable log-probs `[N, T]` of `rollout.response_ids`, and token entropy `[N, T]` if asked
        (differentiable unless `entropy_grad=False`: then only a logged metric)."""

    def sampling_copy(self) -> Policy:
        """A policy that samples as this one does from weights of its own, so that it can sample in a
        background thread while this one trains (`RLVRModule(rollout_staleness=1)` copies the weights into it
        before each rollout). It shares the frozen parameters, which never change: a LoRA policy's copy holds
        only its adapter. A policy whose sampler already owns a copy of the weights may return itself."""
        frozen = {id(p): p for p in self.parameters() if not p.requires_grad}
        return copy.deepcopy(self, frozen)

    # The hook a PPO value model reads: hidden states of the positions that predict the response tokens.

    @property
    def hidden_size(self) -> int:
        """Width `H` of the hidden states of `token_log_probs_and_hidden`."""
        raise NotImplementedError(f"{type(self).__name__} does not expose hidden states (a PPO value model reads them)")

    def token_log_probs_and_hidden(
        self, rollout: Rollout, temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = True
    ) -> tuple[Tensor, Tensor | None, Tensor]:
        """`token_log_probs`, plus the last hidden states `[N, T, H]` of the positions whose logits score
        `response_ids[:, t]` (the state before token t), from the same forward pass (differentiable)."""
        raise NotImplementedError(f"{type(self).__name__} does not expose hidden states (a PPO value model reads them)")

    def response_hidden_states(self, rollout: Rollout) -> Tensor:
        """The hidden states of `token_log_probs_and_hidden` alone; a policy may skip its output layer here."""
        return self.token_log_probs_and_hidden(rollout)[2]

    def create_reference(self) -> nn.Module:
        """A frozen copy used as the KL reference. Policies with adapters override this to share weights."""
        reference = copy.deepcopy(self)
        reference.requires_grad_(False)
        reference.eval()
        return reference

    @torch.no_grad()
    def update_reference(self, reference: nn.Module, alpha: float = 1.0) -> None:
        """`ref <- alpha * policy + (1 - alpha) * ref` (alpha = 1 copies; TR-DPO mixup otherwise).

        Adapter-based policies may raise NotImplementedError for alpha < 1."""
        for ref_param, param in zip(reference.parameters(), self.parameters(), strict=True):
            ref_param.lerp_(param.detach(), alpha)

    def reference_log_probs(self, reference: nn.Module, rollout: Rollout, temperature: float) -> Tensor:
        """Log-probs `[N, T]` under `reference` (no grad)."""
        with torch.no_grad():
            log_probs, _ = reference.token_log_probs(rollout, temperature=temperature)
        return log_probs

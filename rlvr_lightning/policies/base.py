"""The `Policy` interface: what the training modules need from a model.

A batch of prompts, as the data module yields it, is a dict:

    {"prompt": list[P], "metadata": list[dict]}

where each prompt is whatever the policy understands (token ids for the toy sort policy,
text or chat messages for language models) and each metadata dict carries the task's
per-prompt facts (ground truth, test cases, ...). `sample` repeats every prompt `n` times
into contiguous groups and returns a `Rollout` (shapes documented in `rlvr_lightning.rollout`).
"""

from __future__ import annotations

import contextlib
import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.rollout import Rollout

#: a statistic of each position's logits: `(logits [N, T, V], token_ids [N, T], temperature) -> [N, T]`
LogitStatistic = Callable[[Tensor, Tensor, float], Tensor]

PromptBatch = dict[str, list[Any]]


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

    def support_log_probs(
        self, rollout: Rollout, support: Tensor, temperature: float = 1.0, with_entropy: bool = False,
        entropy_grad: bool = True,
    ) -> tuple[Tensor, Tensor | None, Tensor]:  # fmt: skip
        """`token_log_probs`, and the log-probs `[N, T, k]` of the token ids `support` `[N, T, k]` at each response
        position from the same forward (differentiable; 0 on masked positions): logit-level distillation's student."""
        raise NotImplementedError(f"{type(self).__name__} does not score a support of tokens (logit distillation)")

    def top_k_scores(
        self, rollout: Rollout, k: int, temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = True
    ) -> tuple[Tensor, Tensor | None, Tensor, Tensor]:
        """The log-probs `[N, T]` of `rollout.response_ids` (and entropies, as `token_log_probs`), and at each
        response position the log-probs `[N, T, k]` of the `k` most probable tokens (most probable first) and their
        ids `[N, T, k]` (0 on masked positions), all from one forward: the log-probs differentiable, the ids found
        without gradient (SimKO's candidates; logit-level distillation's teacher, under `top_log_probs`)."""
        raise NotImplementedError(f"{type(self).__name__} does not give its top-k log-probs (logit distillation)")

    @torch.no_grad()
    def top_log_probs(self, rollout: Rollout, k: int, temperature: float = 1.0) -> tuple[Tensor, Tensor, Tensor]:
        """`top_k_scores` without gradients or entropies: the log-probs, the top-k's log-probs and their ids."""
        log_probs, _, values, ids = self.top_k_scores(rollout, k, temperature)
        return log_probs, values, ids

    def logit_statistics(self, rollout: Rollout, statistic: LogitStatistic, temperature: float = 1.0) -> Tensor:
        """No grad: `statistic(logits, token_ids, temperature)` `[N, T]` from the logits `[N, T, V]` that score
        `rollout.response_ids` (0 on masked positions). `OptimalTokenBaseline` reads the token energies
        (`core.log_probs.token_energy_from_logits`), `SelfCertaintyReward` the self-certainty
        (`core.log_probs.self_certainty_from_logits`)."""
        raise NotImplementedError(f"{type(self).__name__} does not compute statistics of its logits")

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

    def prompt_state(self, rollout: Rollout) -> Tensor:
        """`[N, H]` a summary of each row's prompt (differentiable, `hidden_size` wide), e.g. for a head that
        estimates a value of the prompt (FlowRL's partition function)."""
        raise NotImplementedError(f"{type(self).__name__} does not summarise its prompts (Policy.prompt_state)")

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

    @contextlib.contextmanager
    def reference_scoring(self, reference: nn.Module) -> Iterator[Policy]:
        """No grad; inside, the policy whose scoring methods score as `reference` (a copy of `create_reference`)."""
        with torch.no_grad():
            yield reference

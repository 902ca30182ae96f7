"""The toy sorting policy of the CS336 (Stanford, spring 2025) lecture 17 walkthrough.

Embed the prompt tokens, transform each with a per-prompt-position matrix and sum them
into one hidden vector, expand that into one vector per response position with a
per-response-position matrix, and project to the vocabulary. Every response position is
sampled independently (non-autoregressive), so one forward pass scores a whole response.

The lecture's model is bilinear: the logits of a response position are a sum of one score
per prompt position, which cannot express "the second-smallest token". `activation` applies
a nonlinearity to the summed encoding, turning the model into a one-hidden-layer network
that can; `activation=None` is the lecture's model.

With `eos_token` set, a response ends at its first `eos_token` (included in `response_mask`, as a
language model's EOS is), which makes response lengths vary: the length-bias diagnostics need that.
`hidden_states` (the vector each response position is projected from) is what a PPO value head reads.
"""

from __future__ import annotations

import math
from typing import Annotated

import torch
from torch import Tensor, nn

from rlvr_lightning.core.entropy import entropy_from_log_probs
from rlvr_lightning.core.log_probs import top_log_probs_from_logits
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.policies.base import LogitStatistic, Policy, PromptBatch
from rlvr_lightning.policies.memory_estimate import check_fits_in_memory
from rlvr_lightning.policies.token_scores import Scores, Support
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.devices import compute_device
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import POSITIVE_INT, Range

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh}


@documented_options
class ToySortPolicy(Policy):
    def __init__(
        self,
        vocab_size: Annotated[int, Option("tokens in the vocabulary.", Range(2, integer=True))] = 10,
        prompt_length: Annotated[int, Option("tokens per prompt.", POSITIVE_INT)] = 4,
        response_length: Annotated[
            int | None, Option("tokens per response (null: prompt_length).", Range(1, integer=True, optional=True))
        ] = None,
        embedding_dim: Annotated[int, Option("the width of the embedding.", POSITIVE_INT)] = 10,
        tie_embeddings: bool = True,
        activation: str | None = None,
        eos_token: int | None = None,
    ) -> None:
        """`tie_embeddings` reuses the embedding as output
        projection (as the lecture does); `activation` is one of `ACTIVATIONS` or None (the lecture's model);
        `eos_token`: a token id that ends a response (None: every response is `response_length` tokens)."""
        check_options(ToySortPolicy, locals())
        response_length = response_length or prompt_length
        matrices, vectors = (prompt_length + response_length) * embedding_dim**2, vocab_size * embedding_dim
        check_fits_in_memory(
            "embedding_dim" if matrices >= vectors else "vocab_size",
            f"ToySortPolicy(vocab_size={vocab_size}, embedding_dim={embedding_dim})",
            matrices + vectors * (1 if tie_embeddings else 2),
            4,
        )
        super().__init__()
        if activation is not None and activation not in ACTIVATIONS:
            raise ValueError(f"activation={activation!r} is not valid; choose one of {sorted(ACTIVATIONS)} or null")
        if eos_token is not None and not 0 <= eos_token < vocab_size:
            raise ValueError(f"eos_token={eos_token} is not a token of the vocabulary range(vocab_size={vocab_size})")
        self.eos_token = eos_token
        self.embedding_dim = embedding_dim
        self.activation = ACTIVATIONS[activation]() if activation else nn.Identity()
        self.vocab_size = vocab_size
        self.prompt_length = prompt_length
        self.response_length = response_length
        scale = 1 / math.sqrt(embedding_dim)
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.encode_weights = nn.Parameter(torch.randn(prompt_length, embedding_dim, embedding_dim) * scale)
        self.decode_weights = nn.Parameter(torch.randn(self.response_length, embedding_dim, embedding_dim) * scale)
        self.output = None if tie_embeddings else nn.Linear(embedding_dim, vocab_size, bias=False)

    @property
    def hidden_size(self) -> int:
        return self.embedding_dim

    def encode(self, prompt_ids: Tensor) -> Tensor:
        """`[B, D]`: the prompt's encoding, which every response position is decoded from."""
        embedded = self.embedding(prompt_ids)  # [B, P, D]
        return self.activation(torch.einsum("bpd,pde->be", embedded, self.encode_weights))

    def hidden_states(self, prompt_ids: Tensor) -> Tensor:
        """`[B, response_length, D]`: the vector each response position's logits are projected from."""
        return torch.einsum("be,red->brd", self.encode(prompt_ids), self.decode_weights)

    def project(self, hidden: Tensor) -> Tensor:
        """Logits from hidden states (the tied embedding, or the output layer)."""
        if self.output is None:
            return hidden @ self.embedding.weight.T
        return self.output(hidden)

    def forward(self, prompt_ids: Tensor, with_hidden: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Logits `[B, response_length, V]` for prompts `[B, prompt_length]` (and the hidden states they are
        projected from). Scoring goes through `forward`: a sharded (FSDP2) policy gathers its parameters there."""
        hidden = self.hidden_states(prompt_ids)
        logits = self.project(hidden)
        return (logits, hidden) if with_hidden else logits

    def _prompt_tensor(self, prompts: list) -> Tensor:
        prompt_ids = torch.as_tensor(prompts, dtype=torch.long, device=compute_device(self))
        if prompt_ids.ndim != 2 or prompt_ids.shape[1] != self.prompt_length:
            raise ValueError(
                f"ToySortPolicy(prompt_length={self.prompt_length}) got prompts of shape {tuple(prompt_ids.shape)}"
            )
        return prompt_ids

    @torch.no_grad()
    def sample(
        self, batch: PromptBatch, n: int, sampling: SamplingConfig, generator: torch.Generator | None = None
    ) -> Rollout:
        prompt_ids = self._prompt_tensor(batch["prompt"])
        num_prompts = prompt_ids.shape[0]
        logits = self._logits(prompt_ids, sampling.temperature)  # [B, R, V]
        if sampling.do_sample:
            probs = torch.softmax(logits.reshape(-1, self.vocab_size), dim=-1)
            samples = torch.multinomial(probs, num_samples=n, replacement=True, generator=generator)  # [B*R, n]
            response_ids = samples.view(num_prompts, self.response_length, n).transpose(1, 2)
        else:
            response_ids = logits.argmax(-1).unsqueeze(1).expand(num_prompts, n, self.response_length)
        # Sampling runs the training forward, so its log-probs are the old log-probs (no second forward).
        log_softmax = torch.log_softmax(logits, dim=-1).unsqueeze(1).expand(num_prompts, n, *logits.shape[1:])
        old_log_probs = log_softmax.gather(-1, response_ids.unsqueeze(-1))
        response_ids = response_ids.reshape(num_prompts * n, self.response_length)
        rows = num_prompts * n
        metadata = batch.get("metadata") or [{} for _ in range(num_prompts)]
        response_mask, truncated = self._response_mask(response_ids)
        return Rollout(
            prompt_ids=prompt_ids.repeat_interleave(n, dim=0),
            prompt_mask=torch.ones(rows, self.prompt_length, dtype=torch.long, device=prompt_ids.device),
            response_ids=response_ids,
            response_mask=response_mask,
            group_index=torch.arange(num_prompts, device=prompt_ids.device).repeat_interleave(n),
            group_size=n,
            truncated=truncated,
            metadata=[metadata[i] for i in range(num_prompts) for _ in range(n)],
            old_log_probs=old_log_probs.view(num_prompts * n, self.response_length),
        )

    def _response_mask(self, response_ids: Tensor) -> tuple[Tensor, Tensor]:
        """`response_mask` (1 through the first EOS) and `truncated` (no EOS) of sampled responses."""
        rows = response_ids.shape[0]
        if self.eos_token is None:
            ones = torch.ones(rows, self.response_length, device=response_ids.device)
            return ones, torch.zeros(rows, dtype=torch.bool, device=response_ids.device)
        is_eos = (response_ids == self.eos_token).long()
        # a position is in the response while no EOS came before it (the EOS itself is in)
        eos_before = torch.cumsum(is_eos, dim=-1) - is_eos
        return (eos_before == 0).float(), is_eos.sum(dim=-1) == 0

    def _logits(self, prompt_ids: Tensor, temperature: float) -> Tensor:
        logits = self(prompt_ids)
        return logits if temperature == 1.0 else logits / temperature

    def token_log_probs(
        self, rollout: Rollout, temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        return self._score(rollout, temperature, with_entropy, with_hidden=False)[:2]

    def token_log_probs_and_hidden(
        self, rollout: Rollout, temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = True
    ) -> tuple[Tensor, Tensor | None, Tensor]:
        return self._score(rollout, temperature, with_entropy, with_hidden=True)[:3]

    def prompt_state(self, rollout: Rollout) -> Tensor:
        """`[N, D]` each row's prompt encoding (`encode`)."""
        return self.encode(rollout.prompt_ids)

    def support_log_probs(
        self, rollout: Rollout, support: Tensor, temperature: float = 1.0, with_entropy: bool = False,
        entropy_grad: bool = True,
    ) -> tuple[Tensor, Tensor | None, Tensor]:  # fmt: skip
        scores = self._score(rollout, temperature, with_entropy, False, Support(ids=support))
        return scores.log_probs, scores.entropy, scores.support

    def top_k_scores(
        self, rollout: Rollout, k: int, temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = True
    ) -> tuple[Tensor, Tensor | None, Tensor, Tensor]:
        scores = self._score(rollout, temperature, with_entropy, False, Support(top_k=k))
        return scores.log_probs, scores.entropy, scores.support, scores.support_ids

    @torch.no_grad()
    def logit_statistics(self, rollout: Rollout, statistic: LogitStatistic, temperature: float = 1.0) -> Tensor:
        runs = rollout.prompt_runs()
        logits = self(rollout.prompt_ids[runs.first_rows])[runs.row_run]  # [N, R, V]
        values = statistic(logits, rollout.response_ids, temperature)
        return torch.where(rollout.response_mask > 0, values, 0.0)

    def _score(
        self,
        rollout: Rollout,
        temperature: float,
        with_entropy: bool,
        with_hidden: bool,
        support: Support | None = None,
    ) -> Scores:
        # Rows of one prompt share their distribution: run the model and the softmax once per prompt.
        runs = rollout.prompt_runs()
        logits, hidden = self(rollout.prompt_ids[runs.first_rows], with_hidden=True)  # [U, R, V], [U, R, D]
        if temperature != 1.0:
            logits = logits / temperature
        log_softmax = torch.log_softmax(logits, dim=-1)  # [U, R, V]
        if runs.run_length:
            # equal contiguous groups: broadcast instead of copying every row's distribution
            per_row = log_softmax.unsqueeze(1).expand(log_softmax.shape[0], runs.run_length, *log_softmax.shape[1:])
            log_probs = per_row.gather(-1, rollout.response_ids.view(*per_row.shape[:3], 1)).view(rollout.num_rows, -1)
        else:
            log_probs = log_softmax[runs.row_run].gather(-1, rollout.response_ids.unsqueeze(-1)).squeeze(-1)
        per_row = (
            (lambda t: t.repeat_interleave(runs.run_length, dim=0)) if runs.run_length else (lambda t: t[runs.row_run])
        )
        entropy = per_row(entropy_from_log_probs(log_softmax)) if with_entropy else None
        scores = Scores(log_probs, entropy, per_row(hidden) if with_hidden else None)
        if support is None:
            return scores
        rows = log_softmax[runs.row_run]
        if support.ids is not None:  # [N, R, k]
            return scores._replace(support=rows.gather(-1, support.ids.long()))
        ids = top_log_probs_from_logits(rows, support.top_k)[1]  # which tokens: no gradient
        return scores._replace(support=rows.gather(-1, ids), support_ids=ids)

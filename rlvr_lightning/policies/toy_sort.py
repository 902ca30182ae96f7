"""The toy sorting policy of the CS336 (Stanford, spring 2025) lecture 17 walkthrough.

Embed the prompt tokens, transform each with a per-prompt-position matrix and sum them
into one hidden vector, expand that into one vector per response position with a
per-response-position matrix, and project to the vocabulary. Every response position is
sampled independently (non-autoregressive), so one forward pass scores a whole response.

The lecture's model is bilinear: the logits of a response position are a sum of one score
per prompt position, which cannot express "the second-smallest token". `activation` applies
a nonlinearity to the summed encoding, turning the model into a one-hidden-layer network
that can; `activation=None` is the lecture's model.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from rlvr_lightning.core.entropy import entropy_from_log_probs
from rlvr_lightning.policies.base import Policy, PromptBatch, SamplingConfig
from rlvr_lightning.rollout import Rollout


ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh}


class ToySortPolicy(Policy):
    def __init__(
        self,
        vocab_size: int = 10,
        prompt_length: int = 4,
        response_length: int | None = None,
        embedding_dim: int = 10,
        tie_embeddings: bool = True,
        activation: str | None = None,
    ) -> None:
        """`response_length` defaults to `prompt_length`; `tie_embeddings` reuses the embedding as output
        projection (as the lecture does); `activation` is one of `ACTIVATIONS` or None (the lecture's model)."""
        super().__init__()
        if activation is not None and activation not in ACTIVATIONS:
            raise ValueError(f"activation={activation!r} is not valid; choose one of {sorted(ACTIVATIONS)} or null")
        self.activation = ACTIVATIONS[activation]() if activation else nn.Identity()
        self.vocab_size = vocab_size
        self.prompt_length = prompt_length
        self.response_length = response_length or prompt_length
        scale = 1 / math.sqrt(embedding_dim)
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.encode_weights = nn.Parameter(torch.randn(prompt_length, embedding_dim, embedding_dim) * scale)
        self.decode_weights = nn.Parameter(torch.randn(self.response_length, embedding_dim, embedding_dim) * scale)
        self.output = None if tie_embeddings else nn.Linear(embedding_dim, vocab_size, bias=False)

    def forward(self, prompt_ids: Tensor) -> Tensor:
        """Logits `[B, response_length, V]` for prompts `[B, prompt_length]`."""
        embedded = self.embedding(prompt_ids)  # [B, P, D]
        encoded = self.activation(torch.einsum("bpd,pde->be", embedded, self.encode_weights))
        decoded = torch.einsum("be,red->brd", encoded, self.decode_weights)
        if self.output is None:
            return decoded @ self.embedding.weight.T
        return self.output(decoded)

    def _prompt_tensor(self, prompts: list) -> Tensor:
        prompt_ids = torch.as_tensor(prompts, dtype=torch.long, device=self.embedding.weight.device)
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
        return Rollout(
            prompt_ids=prompt_ids.repeat_interleave(n, dim=0),
            prompt_mask=torch.ones(rows, self.prompt_length, dtype=torch.long, device=prompt_ids.device),
            response_ids=response_ids,
            response_mask=torch.ones(rows, self.response_length, device=prompt_ids.device),
            group_index=torch.arange(num_prompts, device=prompt_ids.device).repeat_interleave(n),
            group_size=n,
            truncated=torch.zeros(rows, dtype=torch.bool, device=prompt_ids.device),
            metadata=[metadata[i] for i in range(num_prompts) for _ in range(n)],
            old_log_probs=old_log_probs.view(num_prompts * n, self.response_length),
        )

    def _logits(self, prompt_ids: Tensor, temperature: float) -> Tensor:
        logits = self(prompt_ids)
        return logits if temperature == 1.0 else logits / temperature

    def token_log_probs(
        self, rollout: Rollout, temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        # Rows of one prompt share their distribution: run the model and the softmax once per prompt.
        runs = rollout.prompt_runs()
        log_softmax = torch.log_softmax(self._logits(rollout.prompt_ids[runs.first_rows], temperature), dim=-1)  # [U, R, V]
        if runs.run_length:
            # equal contiguous groups: broadcast instead of copying every row's distribution
            per_row = log_softmax.unsqueeze(1).expand(log_softmax.shape[0], runs.run_length, *log_softmax.shape[1:])
            log_probs = per_row.gather(-1, rollout.response_ids.view(*per_row.shape[:3], 1)).view(rollout.num_rows, -1)
        else:
            log_probs = log_softmax[runs.row_run].gather(-1, rollout.response_ids.unsqueeze(-1)).squeeze(-1)
        entropy = None
        if with_entropy:
            entropy = entropy_from_log_probs(log_softmax)
            entropy = entropy.repeat_interleave(runs.run_length, dim=0) if runs.run_length else entropy[runs.row_run]
        return log_probs, entropy

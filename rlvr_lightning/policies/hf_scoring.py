"""Scoring responses with a Hugging Face causal LM: differentiable log-probs (and entropy) of the
tokens of a `Rollout`.

Each distinct prompt of the rows runs through the model once and its rows' responses run on top of
its key/value cache (`share_prompt_prefix`; the rows of a group share their prompt), which saves
most of the prompt's share of the forward and backward passes. Where that cannot apply (sliding
windows, gradient checkpointing, rows that share nothing) one joint forward over prompt + response
gives the same numbers.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlvr_lightning.core.log_probs import token_log_probs_and_entropy, token_log_probs_from_logits
from rlvr_lightning.policies.generation import position_ids_from_mask
from rlvr_lightning.rollout import Rollout

class HFScoring:
    """`token_log_probs` for `HFPolicy` (a mixin: needs `model`, `base_model`, `hf_config`,
    `share_prompt_prefix` and `gradient_checkpointing`)."""

    model: nn.Module
    share_prompt_prefix: bool
    gradient_checkpointing: bool

    def token_log_probs(
        self, rollout: Rollout, temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """Log-probs `[N, T]` of `rollout.response_ids` at `temperature` (0 on masked positions), and the
        token entropy `[N, T]` if asked; `entropy_grad=False` computes it detached (a logged metric only),
        without keeping its `[N, T, V]` intermediates for the backward pass."""
        num_rows, width = rollout.response_ids.shape
        if width == 0:
            empty = rollout.response_mask.new_zeros((num_rows, 0))
            return empty, (empty if with_entropy else None)
        logits, t = self._forward_response_logits(rollout)
        mask = rollout.response_mask[:, :t] > 0
        ids = rollout.response_ids[:, :t]
        entropy = None
        if with_entropy:
            log_probs, entropy = token_log_probs_and_entropy(logits, ids, temperature, entropy_grad)
            entropy = F.pad(torch.where(mask, entropy, 0.0), (0, width - t))
        else:
            log_probs = token_log_probs_from_logits(logits, ids, temperature)
        log_probs = F.pad(torch.where(mask, log_probs, 0.0), (0, width - t))
        return log_probs, entropy

    def _forward_response_logits(self, rollout: Rollout) -> tuple[Tensor, int]:
        """Logits `[N, t, V]` of the positions predicting `response_ids[:, :t]` (t = last masked column + 1)."""
        prompt_mask = rollout.prompt_mask
        used_prompt = prompt_mask.bool().any(0).nonzero()
        if used_prompt.numel() == 0:
            raise ValueError("token_log_probs: every prompt in the rows is empty")
        first = int(used_prompt[0].item())
        used_response = rollout.response_mask.bool().any(0).nonzero()
        t = int(used_response[-1].item()) + 1 if used_response.numel() else 1
        t = min(t, rollout.response_ids.shape[1])
        prompt_ids, prompt_mask = rollout.prompt_ids[:, first:], prompt_mask[:, first:]
        if self.share_prompt_prefix and self._prefix_sharing_supported():
            shared = self._shared_prefix_logits(prompt_ids, prompt_mask, rollout.response_ids[:, : t - 1])
            if shared is not None:
                return shared, t
        ids = torch.cat([prompt_ids, rollout.response_ids[:, : t - 1]], dim=1)
        mask = torch.cat(
            [prompt_mask, torch.ones_like(rollout.response_ids[:, : t - 1], dtype=prompt_mask.dtype)], dim=1
        )
        kwargs: dict[str, Any] = {}
        if self._logits_to_keep_supported():
            kwargs["logits_to_keep"] = t
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=False, **kwargs
        )
        return out.logits[:, -t:, :], t

    def _shared_prefix_logits(self, prompt_ids: Tensor, prompt_mask: Tensor, responses: Tensor) -> Tensor | None:
        """The logits of `_forward_response_logits`, with each distinct prompt run through the model once.

        The rows of a group share their prompt: its key/value cache is computed once (with gradients)
        and gathered for every row, then the responses run on top of it. Same numbers as the joint
        forward, about `len(prompt) * (rows - distinct prompts)` fewer token positions. None when the
        rows do not share prompts (nothing to gain) or the model's cache is not a plain KV cache.
        """
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        num_rows = prompt_ids.shape[0]
        distinct, inverse = torch.unique(torch.cat([prompt_ids, prompt_mask], dim=1), dim=0, return_inverse=True)
        if distinct.shape[0] * 4 > num_rows * 3:  # under 25% of the prompt tokens saved: one joint forward
            return None
        width = prompt_ids.shape[1]
        unique_ids, unique_mask = distinct[:, :width], distinct[:, width:]
        unique_positions = position_ids_from_mask(unique_mask)
        kwargs: dict[str, Any] = {"logits_to_keep": 1} if self._logits_to_keep_supported() else {}
        cache = DynamicCache(config=self.hf_config)
        out = self.model(
            input_ids=unique_ids,
            attention_mask=unique_mask,
            position_ids=unique_positions,
            past_key_values=cache,
            use_cache=True,
            **kwargs,
        )
        cache = out.past_key_values
        if not all(type(layer) is DynamicLayer for layer in getattr(cache, "layers", [None])):
            self._prefix_sharing = False  # sliding windows, linear attention, ...: always the joint forward
            return None
        first_logits = out.logits[:, -1:, :][inverse]
        del out
        if responses.shape[1] == 0:
            return first_logits
        cache.batch_select_indices(inverse)
        mask = torch.cat([prompt_mask, torch.ones_like(responses, dtype=prompt_mask.dtype)], dim=1)
        start = unique_positions[:, -1][inverse] + 1
        positions = start.unsqueeze(1) + torch.arange(responses.shape[1], device=responses.device)
        out = self.model(
            input_ids=responses, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True
        )
        return torch.cat([first_logits, out.logits], dim=1)

    def _prefix_sharing_supported(self) -> bool:
        supported = getattr(self, "_prefix_sharing", None)
        if supported is None:
            text_config = self.hf_config.get_text_config(decoder=True) if hasattr(self.hf_config, "get_text_config") else self.hf_config
            layer_types = getattr(text_config, "layer_types", None) or ["full_attention"]
            supported = (
                not self.gradient_checkpointing  # transformers turns the cache off in train mode then
                and not getattr(text_config, "sliding_window", None)
                and all(kind == "full_attention" for kind in layer_types)
            )
            self._prefix_sharing = supported
        return supported

    def _logits_to_keep_supported(self) -> bool:
        supported = getattr(self, "_logits_to_keep", None)
        if supported is None:
            supported = "logits_to_keep" in inspect.signature(self.base_model.forward).parameters
            self._logits_to_keep = supported
        return supported

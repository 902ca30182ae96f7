"""`SequenceClassifierReward`: a reward model (`AutoModelForSequenceClassification`) scores each response.

    trainer:
      callbacks:
        - class_path: rlvr_lightning.rewards.reward_model.SequenceClassifierReward
          init_args:
            model_name_or_path: /models/my-reward-model   # a local directory (or alias); config: {...} for tests
            template: "{prompt}{response}<|im_end|>"       # the text the model was trained to score
            batch_size: 8

Each row's text is the `template` filled in as for a judge (`rewards.judge_prompt`; by default the prompt
as the policy saw it followed by the response; only ``{response}`` is cleaned of the model's special
tokens, since the policy's own chat-formatted prompt legitimately holds them). Rows are tokenized,
right-padded and scored `batch_size` at a time; the model pools the last non-pad token (or its first,
for encoder models) exactly as it does for one unpadded row, so a row's score does not depend on its
batch. The score is the logit of a one-label model (its sigmoid with `sigmoid: true`), or the
probability of label `label` of a many-label classifier (default the last label, e.g. "good").

A row longer than `max_length` tokens (default the model's context) is not scored: it scores 0 and is
counted (`rewards.model_reward`), like every other failed row.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import nn

from rlvr_lightning.policies import hf_loading
from rlvr_lightning.policies.hf_options import DTYPES
from rlvr_lightning.rewards.judge_prompt import JudgePrompt
from rlvr_lightning.rewards.model_reward import ModelReward
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.model_cache import resolve_model_path


def load_sequence_classifier(
    model_name_or_path: str | None, config: dict[str, Any] | str | None, tokenizer: Any, dtype: torch.dtype
) -> nn.Module:
    """`AutoModelForSequenceClassification` from a directory or alias, or random weights from a config."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    if config is None:
        if model_name_or_path is None:
            raise ValueError("SequenceClassifierReward needs model_name_or_path or config")
        return AutoModelForSequenceClassification.from_pretrained(resolve_model_path(model_name_or_path), dtype=dtype)
    if isinstance(config, (str, os.PathLike)):
        hf_config = AutoConfig.from_pretrained(str(config))
    else:
        values = dict(config)
        if "model_type" not in values:
            raise ValueError("SequenceClassifierReward(config={...}) needs a 'model_type' (e.g. 'llama')")
        values.setdefault("vocab_size", len(tokenizer))
        values.setdefault("num_labels", 1)
        values.setdefault("pad_token_id", tokenizer.pad_token_id)
        hf_config = AutoConfig.for_model(values.pop("model_type"), **values)
    return AutoModelForSequenceClassification.from_config(hf_config, dtype=dtype)


def right_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`input_ids long[B, L]` padded on the right with `pad_id`, and the attention mask (1 on real tokens)."""
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        input_ids[b, : len(row)] = torch.as_tensor(row, dtype=torch.long)
        attention_mask[b, : len(row)] = 1
    return input_ids, attention_mask


class SequenceClassifierReward(ModelReward):
    """A sequence-classification reward model's score of each response (see the module docstring)."""

    def __init__(
        self,
        model_name_or_path: str | None = None,
        config: dict[str, Any] | str | None = None,
        tokenizer_name_or_path: str | None = None,
        template: str = "{prompt}{response}",
        label: int | None = None,
        sigmoid: bool = False,
        max_length: int | None = None,
        add_special_tokens: bool = False,
        dtype: Literal["float32", "bfloat16", "float16"] = "float32",
        **kwargs: Any,
    ) -> None:
        """
        Args:
            model_name_or_path: a local directory, hub id in the local cache, or `rlvr-models` alias.
            config: random weights from a config (dict with `model_type`, or a path), for tests.
            tokenizer_name_or_path: the tokenizer (default: the model's).
            template: the text scored, with ``{response}`` and optionally ``{prompt}`` and metadata fields.
            label: which label's probability a many-label classifier gives (default the last).
            sigmoid: squash a one-label model's logit into (0, 1).
            max_length: longest row in tokens (default the model's `max_position_embeddings`).
            add_special_tokens: let the tokenizer add BOS/EOS (off: the template and the prompt carry them).
            **kwargs: `ModelReward`'s options (`batch_size`, `batch_timeout_s`, `correct_threshold`) and
                `RewardCallback`'s (`weight`, `name`, `on_error`).
        """
        kwargs["name"] = kwargs.get("name") or "reward_model"
        super().__init__(**kwargs)
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        source = tokenizer_name_or_path or model_name_or_path
        if source is None:
            raise ValueError("SequenceClassifierReward(config=...) needs tokenizer_name_or_path for the tokenizer")
        kind = "Tokenizer" if tokenizer_name_or_path else "Model"
        self.tokenizer = hf_loading.load_tokenizer(resolve_model_path(source, kind), None)
        self.tokenizer.padding_side = "right"
        self.model = load_sequence_classifier(model_name_or_path, config, self.tokenizer, DTYPES[dtype])
        self.model.eval()
        self.model.requires_grad_(False)
        if self.model.config.pad_token_id is None:  # batches need it to find each row's last token
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        num_labels = self.model.config.num_labels
        if label is not None and not 0 <= label < num_labels:
            raise ValueError(f"label must be in [0, {num_labels}) for this {num_labels}-label model, got {label}")
        if sigmoid and num_labels != 1:
            raise ValueError(f"sigmoid applies to a one-label model; this one has {num_labels} labels (use label=)")
        self.label = num_labels - 1 if label is None else label
        self.sigmoid = sigmoid
        self.add_special_tokens = add_special_tokens
        self.max_length = max_length or getattr(self.model.config, "max_position_embeddings", None)
        self.prompt = JudgePrompt(template, self.tokenizer, untrusted=["response"])

    @property
    def scorer(self) -> nn.Module:
        return self.model

    @torch.no_grad()
    def score_rows(self, rollout: Rollout, rows: Sequence[int]) -> list[float | Exception]:
        texts = [self.prompt(rollout, i) for i in rows]
        ids = self.tokenizer(texts, add_special_tokens=self.add_special_tokens)["input_ids"]
        results: list[float | Exception] = [
            ValueError(f"row {i} is {len(row)} tokens long, over max_length={self.max_length}")
            if self.max_length is not None and len(row) > self.max_length
            else (ValueError(f"row {i} is empty after tokenization") if not row else 0.0)
            for i, row in zip(rows, ids, strict=True)
        ]
        keep = [k for k, result in enumerate(results) if not isinstance(result, Exception)]
        if keep:
            input_ids, attention_mask = right_pad([ids[k] for k in keep], self.tokenizer.pad_token_id)
            device = next(self.model.parameters()).device
            logits = self.model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)).logits.float()
            if logits.shape[-1] == 1:
                values = torch.sigmoid(logits[:, 0]) if self.sigmoid else logits[:, 0]
            else:
                values = torch.softmax(logits, dim=-1)[:, self.label]
            for k, value in zip(keep, values.tolist(), strict=True):
                results[k] = value
        return results


__all__ = ["SequenceClassifierReward", "load_sequence_classifier"]

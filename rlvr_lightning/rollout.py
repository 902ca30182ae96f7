"""The `Rollout`: everything one training step passes between its stages.

Shapes (documented here once; everything else refers to them):

    N = num_prompts * group_size   rows; the rows of one prompt are contiguous
    P = prompt length (left-padded for language models)
    T = response length (trimmed to the longest response in the batch)

    prompt_ids      long[N, P]
    prompt_mask     long[N, P]     1 on real prompt tokens, 0 on left padding
    response_ids    long[N, T]
    response_mask   float[N, T]    1 on generated tokens up to and including EOS, 0 after
    group_index     long[N]        which prompt of the batch each row came from
    truncated       bool[N]        the response hit max_new_tokens without EOS
    rewards         name -> float[N], one entry per reward callback (unweighted)
    reward          float[N]       weighted total over the reward callbacks
    advantages      float[N] or float[N, T]
    old_log_probs   float[N, T]    log-probs under the policy that sampled (no grad)
    ref_log_probs   float[N, T]    log-probs under the reference policy (no grad)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


@dataclass
class Rollout:
    prompt_ids: Tensor
    prompt_mask: Tensor
    response_ids: Tensor
    response_mask: Tensor
    group_index: Tensor
    group_size: int
    truncated: Tensor
    prompt_text: list[str] | None = None
    response_text: list[str] | None = None
    metadata: list[dict[str, Any]] = field(default_factory=list)
    rewards: dict[str, Tensor] = field(default_factory=dict)
    reward: Tensor | None = None
    advantages: Tensor | None = None
    old_log_probs: Tensor | None = None
    ref_log_probs: Tensor | None = None

    @property
    def num_rows(self) -> int:
        return self.response_ids.shape[0]

    @property
    def num_groups(self) -> int:
        return self.num_rows // self.group_size

    def select(self, rows: Tensor | slice) -> Rollout:
        """The rows `rows` of every per-row field (mini-/micro-batching, dynamic sampling).

        A selection that is not whole groups keeps `group_size` but `num_groups` then means nothing.
        """
        if isinstance(rows, slice):
            rows = torch.arange(self.num_rows)[rows]
        index_list = rows.tolist()
        values: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                value = value[rows]
            elif isinstance(value, dict):
                value = {k: v[rows] for k, v in value.items()}
            elif isinstance(value, list):
                value = [value[i] for i in index_list] if value else value
            values[f.name] = value
        return Rollout(**values)

    def to(self, device: torch.device | str) -> Rollout:
        values: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                value = value.to(device)
            elif isinstance(value, dict):
                value = {k: v.to(device) for k, v in value.items()}
            values[f.name] = value
        return Rollout(**values)

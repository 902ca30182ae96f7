"""The `Rollout`: everything one training step passes between its stages.

Shapes (documented here once; everything else refers to them):

    N = num_prompts * group_size   rows; the rows of one prompt are contiguous
    P = prompt length (left-padded for language models)
    T = response length (trimmed to the longest response in the batch)

    prompt_ids      long[N, P]
    prompt_mask     long[N, P]     1 on real prompt tokens, 0 on left padding
    response_ids    long[N, T]
    response_mask   float[N, T]    1 on the tokens the policy sampled (up to and including EOS), 0 elsewhere:
                                   after the end, and on tokens inserted into the response (tool observations,
                                   a forced `</think>`), which stay in the context of later tokens but get no
                                   loss, KL or entropy. Without insertions it is a prefix of ones.
    group_index     long[N]        which prompt of the batch each row came from
    truncated       bool[N]        the response hit max_new_tokens without EOS
    rewards         name -> float[N], one entry per reward callback (unweighted)
    reward          float[N]       weighted total over the reward callbacks
    advantages      float[N] or float[N, T]
    old_log_probs   float[N, T]    log-probs under the policy that sampled, as the trainer computes them (no grad)
    ref_log_probs   float[N, T]    log-probs under the reference policy (no grad)
    teacher_log_probs float[N, T]  log-probs under the distillation teacher (no grad)
    teacher_top_log_probs float[N, T, k]  logit-level distillation: the teacher's k most probable tokens' log-probs
    teacher_top_ids long[N, T, k]  ... and their ids (`distillation.mode: topk_logits`; 0 where masked)
    teacher_rows    bool[N]        the rows the teacher scored (`SelfTeacher`: those with a demonstration);
                                   None: every row
    demonstration_rows bool[N]     the rows whose response is a demonstration from the data, not sampled
                                   (`RLVRModule`'s `demonstrations`, LUFFY); None: every response was sampled
    sampling_log_probs float[N, T] log-probs the generator recorded while sampling (an inference engine's
                                   kernels and precision may differ from the trainer's; no grad); 0 where masked
    response_source long[N, T]     where each response token came from (`TokenSource`: PAD, SAMPLED, TOOL,
                                   FORCED), the turn structure of multi-turn responses; None when every
                                   response is sampled tokens then padding (`response_mask` says it all)
    values          float[N, T]    PPO: the critic's values V(s_t) when the rollout was scored (no grad)
    returns         float[N, T]    PPO: the critic's regression targets (GAE advantages + values; no grad)
    greedy_reward   float[N]       the reward of the greedy response to each row's prompt, which
                                   `GreedyBaselineAdvantage` reads (ReMax's baseline)
    token_energy    float[N, T]    1 - 2 pi(y_t) + sum_v pi(v)^2 under the trained policy when the rollout is scored:
                                   the squared norm of the gradient of log pi(y_t) in the logits, which
                                   `OptimalTokenBaseline` reads (no grad); 0 where masked
    feedback        list[N]        what the rewards said of each response beyond its score (a failed test's error;
                                   `RewardCallback.feedback`), None for a row they said nothing of; None: nothing said
    prompts         list[N]        each row's prompt as the data gave it (text or chat messages), before the policy's
                                   template renders it as `prompt_text` (None: a policy without text prompts)
    correct         bool[N]        which responses the task reward calls correct, when the update reads it
                                   (VAPO's positive-example LM loss, `RLVRModule.positive_nll_coef`)

A multi-turn response is [sampled | observation | sampled | ...]: `response_mask` 1/0/1, `response_source`
SAMPLED/TOOL/SAMPLED, padding after the end. Use `response_lengths()` for a response's length (tokens it
occupies, inserted ones included: what the token budget counts), not `response_mask.sum(-1)` (sampled ones).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, NamedTuple

import torch
from torch import Tensor


class TokenSource(IntEnum):
    """Where a response token came from (`Rollout.response_source`)."""

    PAD = 0  # after the end of the response
    SAMPLED = 1  # sampled by the policy: the only tokens with loss, KL and entropy (response_mask 1)
    TOOL = 2  # a tool's observation, appended to the context between two turns
    FORCED = 3  # inserted by a generation rule, e.g. the thinking budget's forced `</think>`


class PromptRuns(NamedTuple):
    """The runs of consecutive rows with equal `group_index` (one per prompt in a sampled rollout)."""

    first_rows: Tensor  # long[U]: the first row of each run
    row_run: Tensor  # long[N]: each row's run
    run_length: int  # the length every run has, or 0 when they differ


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
    teacher_log_probs: Tensor | None = None
    teacher_top_log_probs: Tensor | None = None
    teacher_top_ids: Tensor | None = None
    teacher_rows: Tensor | None = None
    demonstration_rows: Tensor | None = None
    sampling_log_probs: Tensor | None = None
    response_source: Tensor | None = None
    values: Tensor | None = None
    returns: Tensor | None = None
    greedy_reward: Tensor | None = None
    token_energy: Tensor | None = None
    correct: Tensor | None = None
    prompts: list[Any] | None = None
    feedback: list[str | None] | None = None

    @property
    def num_rows(self) -> int:
        return self.response_ids.shape[0]

    @property
    def num_groups(self) -> int:
        return self.num_rows // self.group_size

    def response_lengths(self) -> Tensor:
        """Tokens each response occupies (`float[N]`): sampled and inserted ones, not the padding after it."""
        if self.response_source is None:
            return self.response_mask.float().sum(-1)
        return (self.response_source != TokenSource.PAD).float().sum(-1)

    def num_turns(self) -> Tensor:
        """Policy turns per response (`long[N]`): runs of tokens separated by tool observations (a forced
        `</think>` does not start a turn); 0 for an empty response."""
        if self.response_source is None:
            return (self.response_mask.sum(-1) > 0).long()
        own = (self.response_source == TokenSource.SAMPLED) | (self.response_source == TokenSource.FORCED)
        starts = own.clone()
        starts[:, 1:] &= ~own[:, :-1]
        return starts.long().sum(-1)

    def prompt_runs(self) -> PromptRuns:
        """Which rows share a prompt, for policies that compute per prompt what its rows share.

        Computed once per rollout (the loss asks every inner epoch): a host sync on first use."""
        cached = self.__dict__.get("_prompt_runs")
        if cached is not None and cached[0] is self.group_index:
            return cached[1]
        _, row_run, counts = torch.unique_consecutive(self.group_index, return_inverse=True, return_counts=True)
        num_runs = counts.numel()
        equal = num_runs > 0 and self.num_rows % num_runs == 0 and bool((counts == self.num_rows // num_runs).all())
        runs = PromptRuns(torch.cumsum(counts, 0) - counts, row_run, self.num_rows // num_runs if equal else 0)
        self._prompt_runs = (self.group_index, runs)
        return runs

    def select(self, rows: Tensor | slice, host_rows: list[int] | None = None) -> Rollout:
        """The rows `rows` (indices, a slice or a bool mask) of every per-row field (mini-/micro-batching, dynamic
        sampling); `host_rows`: the same indices as a list, when the caller has them (else they are read from `rows`: a
        host synchronisation).

        A selection that is not whole groups keeps `group_size` but `num_groups` then means nothing.
        """
        if isinstance(rows, slice):
            rows = torch.arange(self.num_rows)[rows]
        elif rows.dtype == torch.bool:  # a mask: its rows' indices (a list indexed by True/False would take rows 1/0)
            if rows.shape != (self.num_rows,):
                raise ValueError(f"a row mask must be bool[{self.num_rows}], got shape {tuple(rows.shape)}")
            rows = rows.nonzero().flatten()
            host_rows = None
        index_list = rows.tolist() if host_rows is None else host_rows
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

    @classmethod
    def from_texts(
        cls, response_text: list[str], prompt_text: list[str] | str = "", metadata: list[dict] | None = None
    ) -> Rollout:
        """A rollout of texts alone (one placeholder token each, groups of one), to score text with reward
        callbacks outside training (scripts, tests)."""
        n = len(response_text)
        prompts = [prompt_text] * n if isinstance(prompt_text, str) else list(prompt_text)
        return cls(
            prompt_ids=torch.zeros(n, 1, dtype=torch.long),
            prompt_mask=torch.ones(n, 1, dtype=torch.long),
            response_ids=torch.zeros(n, 1, dtype=torch.long),
            response_mask=torch.ones(n, 1),
            group_index=torch.arange(n),
            group_size=1,
            truncated=torch.zeros(n, dtype=torch.bool),
            prompt_text=prompts,
            response_text=list(response_text),
            metadata=metadata if metadata is not None else [{} for _ in response_text],
        )

    @classmethod
    def concat(cls, rollouts: list[Rollout]) -> Rollout:
        """Rows of several rollouts (e.g. generation rounds of dynamic sampling), groups renumbered.

        Prompts are left-padded and responses right-padded (id 0, mask 0) to the longest;
        optional fields are kept only when every part has them.
        """
        if len({r.group_size for r in rollouts}) != 1:
            raise ValueError("cannot concatenate rollouts with different group sizes")
        rollouts = [r for r in rollouts if r.num_rows > 0] or rollouts[:1]
        if len(rollouts) == 1:
            return rollouts[0]
        prompt_len = max(r.prompt_ids.shape[1] for r in rollouts)
        response_len = max(r.response_ids.shape[1] for r in rollouts)

        def cat(name: str, width: int | None = None, left: bool = False) -> Tensor | None:
            parts = [getattr(r, name) for r in rollouts]
            if any(p is None for p in parts):
                return None
            if width is not None:
                parts = [_pad_columns(p, width, left) if p.ndim >= 2 else p for p in parts]
            return torch.cat(parts)

        # each part's groups numbered 0, 1, ... in order, then offset: a part selected from a larger rollout
        # (dynamic sampling's kept groups) has gaps in its indices, which must not reach the next part's
        dense = [torch.unique(r.group_index, return_inverse=True)[1] for r in rollouts]
        offsets = torch.cumsum(torch.tensor([0] + [int(d.max()) + 1 for d in dense[:-1]]), 0).tolist()
        rewards = {}
        if all(r.rewards.keys() == rollouts[0].rewards.keys() for r in rollouts):
            rewards = {k: torch.cat([r.rewards[k] for r in rollouts]) for k in rollouts[0].rewards}

        def texts(name: str) -> list[str] | None:
            parts = [getattr(r, name) for r in rollouts]
            return None if any(p is None for p in parts) else sum(parts, [])

        return cls(
            prompt_ids=cat("prompt_ids", prompt_len, left=True),
            prompt_mask=cat("prompt_mask", prompt_len, left=True),
            response_ids=cat("response_ids", response_len),
            response_mask=cat("response_mask", response_len),
            group_index=torch.cat([d + off for d, off in zip(dense, offsets, strict=True)]),
            group_size=rollouts[0].group_size,
            truncated=cat("truncated"),
            prompt_text=texts("prompt_text"),
            response_text=texts("response_text"),
            metadata=sum((r.metadata for r in rollouts), []),
            rewards=rewards,
            reward=cat("reward"),
            advantages=cat("advantages", response_len),
            old_log_probs=cat("old_log_probs", response_len),
            ref_log_probs=cat("ref_log_probs", response_len),
            teacher_log_probs=cat("teacher_log_probs", response_len),
            teacher_top_log_probs=cat("teacher_top_log_probs", response_len),
            teacher_top_ids=cat("teacher_top_ids", response_len),
            teacher_rows=cat("teacher_rows"),
            demonstration_rows=_demonstration_rows(rollouts),
            sampling_log_probs=cat("sampling_log_probs", response_len),
            response_source=cat("response_source", response_len),
            values=cat("values", response_len),
            returns=cat("returns", response_len),
            greedy_reward=cat("greedy_reward"),
            token_energy=cat("token_energy", response_len),
            correct=cat("correct"),
            prompts=texts("prompts"),
            feedback=None
            if all(r.feedback is None for r in rollouts)
            else sum((r.feedback or [None] * r.num_rows for r in rollouts), []),
        )

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


def _pad_columns(tensor: Tensor, width: int, left: bool) -> Tensor:
    missing = width - tensor.shape[1]
    if missing == 0:
        return tensor
    pad = tensor.new_zeros(tensor.shape[0], missing, *tensor.shape[2:])
    return torch.cat([pad, tensor] if left else [tensor, pad], dim=1)


def _demonstration_rows(rollouts: list[Rollout]) -> Tensor | None:
    """The parts' `demonstration_rows` joined, a part without them sampled every row (None: no part has any)."""
    parts = [r.demonstration_rows for r in rollouts]
    if all(p is None for p in parts):
        return None
    device = next(p.device for p in parts if p is not None)
    return torch.cat(
        [
            p if p is not None else torch.zeros(r.num_rows, dtype=torch.bool, device=device)
            for p, r in zip(parts, rollouts, strict=True)
        ]
    )

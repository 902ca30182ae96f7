"""Teacher forcing: (prompt, response) pairs as a `Rollout` the policy scores, and their likelihood loss.

`pair_rollout` builds a rollout of group size 1 from given pairs (text for language-model policies,
token-id lists for toy ones), so whatever scores tokens for RL scores them here; `response_nll` is the
negative log-likelihood of its response tokens, the loss of `SFTModule` and `ExpertIterationModule`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from rlvr_lightning.core.aggregation import AGGREGATION_MODES, DELTA_L_MODE, PROMPT_MODE, aggregate_loss
from rlvr_lightning.core.losses.likelihood import likelihood_token_loss
from rlvr_lightning.modules.aggregation_options import AggregationConfig
from rlvr_lightning.policies.base import Policy
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.devices import compute_device


def _is_text_policy(policy: Policy) -> bool:
    """Language-model policies (`HFPolicy`) tokenise text themselves; toy policies take token ids."""
    return hasattr(policy, "tokenizer") and hasattr(policy, "encode_prompts")


def _is_token_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(t, int) for t in value)


def response_token_ids(policy: Policy, response: Any) -> list[int]:
    """Token ids of one response. Text is tokenised without special tokens and ends with EOS
    (so the model learns to stop); token-id lists are taken as they are."""
    if _is_token_list(response):
        return list(response)
    if not _is_text_policy(policy):
        raise TypeError(f"{type(policy).__name__} takes responses as token-id lists, got {type(response).__name__}")
    ids = list(policy.tokenizer(response, add_special_tokens=False)["input_ids"])
    eos = list(getattr(policy, "eos_token_ids", []) or [])
    if eos and (not ids or ids[-1] not in eos):
        ids.append(eos[0])
    return ids


def _pad(rows: Sequence[Sequence[int]], pad_id: int, left: bool) -> tuple[Tensor, Tensor]:
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            span = slice(width - len(row), width) if left else slice(0, len(row))
            ids[i, span] = torch.as_tensor(list(row), dtype=torch.long)
            mask[i, span] = 1
    return ids, mask


def pair_rollout(
    policy: Policy, prompts: Sequence[Any], responses: Sequence[Any], metadata: Sequence[dict] | None = None
) -> Rollout:
    """A teacher-forcing `Rollout` (group size 1) of given (prompt, response) pairs for `policy.token_log_probs`.

    Prompts are left-padded, responses right-padded; `response_mask` covers the response tokens only.
    """
    if len(prompts) != len(responses) or not prompts:
        raise ValueError(
            f"pair_rollout needs as many responses as prompts (>= 1), got {len(prompts)} and {len(responses)}"
        )
    if _is_text_policy(policy):
        prompt_ids_list, prompt_text = policy.encode_prompts(list(prompts))
        pad_id = int(policy.pad_token_id)
    else:
        for i, prompt in enumerate(prompts):
            if not _is_token_list(prompt):
                raise TypeError(
                    f"{type(policy).__name__} takes prompts as token-id lists; prompt {i} is {type(prompt).__name__}"
                )
        prompt_ids_list, prompt_text, pad_id = [list(p) for p in prompts], None, 0
    response_ids_list = [response_token_ids(policy, response) for response in responses]
    for name, rows, expected in (
        ("prompt", prompt_ids_list, getattr(policy, "prompt_length", None)),
        ("response", response_ids_list, getattr(policy, "response_length", None)),
    ):
        for i, row in enumerate(rows):
            if not row:
                raise ValueError(f"{name} {i} of the batch is empty")
            if expected is not None and not _is_text_policy(policy) and len(row) != expected:
                raise ValueError(
                    f"{type(policy).__name__} has {name}_length={expected}, but {name} {i} of the batch has "
                    f"{len(row)} tokens: {row}"
                )
    prompt_ids, prompt_mask = _pad(prompt_ids_list, pad_id, left=True)
    response_ids, response_mask = _pad(response_ids_list, pad_id, left=False)
    device = compute_device(policy)
    rows = len(prompts)
    return Rollout(
        prompt_ids=prompt_ids.to(device),
        prompt_mask=prompt_mask.to(device),
        response_ids=response_ids.to(device),
        response_mask=response_mask.float().to(device),
        group_index=torch.arange(rows, device=device),
        group_size=1,
        truncated=torch.zeros(rows, dtype=torch.bool, device=device),
        prompt_text=list(prompt_text) if prompt_text is not None else None,
        response_text=list(responses) if all(isinstance(r, str) for r in responses) else None,
        metadata=[dict(m) for m in metadata] if metadata else [{} for _ in range(rows)],
    )


def response_nll(
    policy: Policy,
    rollout: Rollout,
    aggregation: AggregationConfig = AggregationConfig(mode="token-mean"),
    **normalisers,
) -> Tensor:
    """Mean negative log-likelihood of the response tokens of `rollout` (differentiable)."""
    return response_loss(policy, rollout, aggregation, "nll", **normalisers)


def response_loss(
    policy: Policy,
    rollout: Rollout,
    aggregation: AggregationConfig = AggregationConfig(mode="token-mean"),
    loss: str = "nll",
    **normalisers,
) -> Tensor:
    """The likelihood loss `loss` (`core.losses.likelihood`: nll or dft) of the response tokens of `rollout`."""
    log_probs, _ = policy.token_log_probs(rollout, temperature=1.0)
    return aggregate_loss(
        likelihood_token_loss(log_probs, loss),
        rollout.response_mask,
        aggregation.mode,
        count_empty_rows=aggregation.count_empty_rows,
        **normalisers,
    )


def check_nll_aggregation(aggregation: AggregationConfig) -> None:
    """The likelihood losses have no fixed response length to divide by (seq-sum-constant, delta-l) and their pairs no
    prompt groups (prompt-mean-token-mean)."""
    invalid = ("seq-sum-constant", PROMPT_MODE, DELTA_L_MODE)
    if aggregation.mode in invalid:
        choices = [m for m in AGGREGATION_MODES if m not in invalid]
        raise ValueError(
            f"aggregation.mode={aggregation.mode!r} is not valid for a likelihood loss; choose one of {choices}"
        )

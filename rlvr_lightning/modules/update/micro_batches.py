"""Which rows of a rollout form each micro-batch: `update.micro_batch_size` rows, or with
`update.micro_batch_tokens` at most that many tokens, grouped by length (`core/packing.py`) and scored
padding-free as one packed sequence each (`HFPolicy.packed_sequences`, which `pack_sequences` turns on)."""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr_lightning.core.packing import fewest_parts, partition_by_tokens
from rlvr_lightning.generation.loop import host_to_device
from rlvr_lightning.modules.options import UpdateConfig
from rlvr_lightning.policies.packing import remember_row_lengths, remembered_row_lengths, row_tokens
from rlvr_lightning.rollout import Rollout


class TokenBudgetError(ValueError):
    """A row longer than `update.micro_batch_tokens` (`rlvr` prints it without a traceback)."""


def check_token_budget(budget: int, response_tokens: int) -> None:
    """Before any work: a budget that not even a one-token prompt and the longest response fit."""
    if budget <= response_tokens:
        raise ValueError(
            f"update.micro_batch_tokens={budget} is smaller than a row can be (a prompt and up to {response_tokens} "
            f"response tokens); valid: an integer >= the longest prompt + {response_tokens}, or null"
        )


def mini_batch_order(rollout: Rollout, shuffle: str) -> Tensor:
    """The rows of `rollout` in the random order its mini-batches take them (`update.shuffle`): rows, or whole
    prompt groups (a rollout's rows of one prompt are contiguous, `group_size` of them)."""
    device = rollout.response_ids.device
    if shuffle == "rows":
        return torch.randperm(rollout.num_rows, device=device)
    first_rows = torch.randperm(rollout.num_groups, device=device) * rollout.group_size
    return (first_rows.unsqueeze(-1) + torch.arange(rollout.group_size, device=device)).flatten()


def micro_batch_parts(rollout: Rollout, update: UpdateConfig) -> list[list[int]] | list[slice]:
    """The rows of each micro-batch of `rollout`, on the host: slices of `update.micro_batch_size` rows, or with
    `update.micro_batch_tokens` index groups of at most that many tokens, balanced by length; as many groups on
    every data-parallel rank (the most any rank needs: each pass is collective under FSDP, and every rank must
    step as often; verl's `rearrange_micro_batches` agrees on the count likewise). The token counts are the
    rollout's `row_lengths`: one host read, remembered for the packed scoring of every micro-batch."""
    budget = update.micro_batch_tokens
    if budget is None:
        size = update.micro_batch_size or update.mini_batch_size or rollout.num_rows
        return [slice(start, start + size) for start in range(0, rollout.num_rows, size)]
    lengths = row_tokens(rollout)
    longest = max(lengths, default=0)
    if longest > budget:
        raise TokenBudgetError(
            f"update.micro_batch_tokens={budget} is smaller than the longest row of this step ({longest} tokens, "
            f"prompt + response); valid: an integer >= {longest} (prompt + max_new_tokens fits every row), or null"
        )
    count = most_across_ranks(fewest_parts(lengths, budget), rollout.response_ids.device)
    return partition_by_tokens(lengths, budget, count)


def micro_batch_rows(rollout: Rollout, update: UpdateConfig) -> list[Tensor] | list[slice]:
    """`micro_batch_parts` as slices or index tensors on the rollout's device."""
    device = rollout.response_ids.device
    return [part if isinstance(part, slice) else _on(part, device) for part in micro_batch_parts(rollout, update)]


def is_whole(rows: list[list[int]] | list[slice], num_rows: int) -> bool:
    """Whether the micro-batches are the rollout itself (one, in order)."""
    return len(rows) == 1 and (isinstance(rows[0], slice) or len(rows[0]) == num_rows)


def select_part(rollout: Rollout, part: list[int] | slice) -> Rollout:
    """The micro-batch of `rollout`'s rows `part`, its `row_lengths` known without a read where the rollout's are."""
    if isinstance(part, slice):
        return rollout.select(part)
    micro = rollout.select(_on(part, rollout.response_ids.device), host_rows=part)
    lengths = remembered_row_lengths(rollout)
    if lengths is not None:
        remember_row_lengths(micro, lengths.subset(part))
    return micro


def micro_batches(rollout: Rollout, update: UpdateConfig):
    """The micro-batches of `rollout` (`micro_batch_parts`), the rollout itself when it is one."""
    parts = micro_batch_parts(rollout, update)
    if is_whole(parts, rollout.num_rows):
        yield rollout
        return
    for part in parts:
        yield select_part(rollout, part)


def scored_in_order(rollout: Rollout, parts: list[list[int]] | list[slice], score) -> Tensor | tuple[Tensor, ...]:
    """`score(micro_batch)` (`[n, ...]`, or a tuple of such) for every row of `rollout` (`parts`:
    `micro_batch_parts`), put back in the rollout's order."""
    if is_whole(parts, rollout.num_rows):
        return score(rollout)
    scored = [score(select_part(rollout, part)) for part in parts]
    if isinstance(scored[0], tuple):
        return tuple(_in_order(list(column), parts) for column in zip(*scored, strict=True))
    return _in_order(scored, parts)


def _in_order(scored: list[Tensor], parts: list[list[int]] | list[slice]) -> Tensor:
    joined = torch.cat(scored)
    if isinstance(parts[0], slice):
        return joined
    order = _on([row for part in parts for row in part], joined.device)
    return torch.empty_like(joined).index_copy_(0, order, joined)


def _on(rows: list[int], device: torch.device) -> Tensor:
    return host_to_device(rows, device, torch.long)


def pack_sequences(*policies) -> None:
    """Have the policies that can score padding-free (`HFPolicy.packed_sequences`) do so; others score as before."""
    for policy in policies:
        if policy is not None and hasattr(policy, "packed_sequences"):
            policy.packed_sequences = True


def most_across_ranks(value: int, device: torch.device) -> int:
    """The largest `value` of all data-parallel ranks (itself on one process)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return value
    if torch.distributed.get_world_size() == 1:
        return value
    tensor = torch.tensor([value], device=device)
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
    return int(tensor.item())

"""The index math of padding-free packing: which rows form a micro-batch, and where each row's tokens lie in
one packed sequence.

    partition_by_tokens([5, 3, 7, 2], budget=8)         -> [[2], [0, 1], [3]]-like: every part <= 8 tokens
    packed_layout(prompt_lengths=[2, 1], response_lengths=[3, 2])
        rows [p p r r | p r]: each row's prompt, then its response without the last token (which no
        position has to predict from), positions restarting at 0 per row; the positions whose outputs
        score the response tokens are `score_index`.
    document_causal_blocks(document_ids, block_size)
        the block-sparse form of "attend within the row, causally" (FlexAttention's `BlockMask` tiles),
        computed per tile, never as an S x S mask.

Pure torch and Python, no model: `policies/packing.py` runs the model over the layout.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

import torch
from torch import Tensor


def balanced_partition(lengths: list[int], num_parts: int) -> list[list[int]]:
    """`num_parts` groups of row indices with sums of `lengths` as equal as greedy makes them: longest row first
    into the lightest group (LPT scheduling; verl's seqlen_balancing balances micro-batches likewise). Each group
    lists its rows in ascending order; no group is empty while `num_parts <= len(lengths)`."""
    parts: list[list[int]] = [[] for _ in range(num_parts)]
    lightest = [(0, 0, k) for k in range(num_parts)]  # (tokens, rows, group): equal loads, fewer rows first
    for row in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        load, count, target = heapq.heappop(lightest)
        parts[target].append(row)
        heapq.heappush(lightest, (load + lengths[row], count + 1, target))
    return [sorted(part) for part in parts]


def fewest_parts(lengths: list[int], budget: int) -> int:
    """The fewest groups `balanced_partition` needs so that no group exceeds `budget` tokens (every row must fit
    on its own; at most one group per row)."""
    if not lengths:
        return 1
    longest = max(lengths)
    if longest > budget:
        raise ValueError(f"a row of {longest} tokens does not fit a budget of {budget}")
    parts = max(1, -(-sum(lengths) // budget))
    while parts < len(lengths) and _largest_part(balanced_partition(lengths, parts), lengths) > budget:
        parts += 1
    return min(parts, len(lengths))


def partition_by_tokens(lengths: list[int], budget: int, num_parts: int | None = None) -> list[list[int]]:
    """Row indices in groups of at most `budget` tokens: `fewest_parts` groups, or exactly `num_parts` (>= that,
    <= the rows; every data-parallel rank must make as many micro-batches as the others)."""
    fewest = fewest_parts(lengths, budget)
    if num_parts is None or num_parts == fewest:
        return balanced_partition(lengths, fewest)
    if not fewest <= num_parts <= max(len(lengths), 1):
        raise ValueError(f"cannot split {len(lengths)} rows into {num_parts} groups within {budget} tokens")
    parts = balanced_partition(lengths, num_parts)
    if _largest_part(parts, lengths) <= budget:
        return parts
    # greedy missed a fit with more groups: split the groups of the fitting partition until there are enough
    parts = balanced_partition(lengths, fewest)
    while len(parts) < num_parts:
        widest = max(range(len(parts)), key=lambda k: (len(parts[k]), -k))
        rows = parts.pop(widest)
        halves = balanced_partition([lengths[i] for i in rows], 2)
        parts.extend([[rows[i] for i in half] for half in halves])
    return parts


def _largest_part(parts: list[list[int]], lengths: list[int]) -> int:
    return max(sum(lengths[i] for i in part) for part in parts)


class PackedLayout(NamedTuple):
    """Where the rows of a micro-batch lie in one packed sequence of `S` positions."""

    row_starts: Tensor  # long[n]: the first position of each row
    position_ids: Tensor  # long[S]: 0, 1, ... within each row
    score_index: Tensor  # long[K]: the positions whose outputs score response tokens, row by row
    score_rows: Tensor  # long[K]: the row of each scored token
    score_columns: Tensor  # long[K]: its column in `response_ids`
    cu_seqlens: Tensor  # int32[n + 1]: row boundaries (flash-attention's varlen form)
    max_length: int  # the longest row in positions
    document_ids: Tensor  # long[S]: the row of each position


def packed_layout(prompt_lengths: Tensor | list[int], response_lengths: Tensor | list[int]) -> PackedLayout:
    """The layout of rows with `prompt_lengths[i]` prompt tokens and `response_lengths[i]` response tokens to
    score (lists, or `long[n]` tensors read to the host; the layout is built on the CPU). Row i takes
    `prompt_lengths[i] + max(response_lengths[i] - 1, 0)` positions; the output at its position
    `prompt_lengths[i] - 1 + j` scores its response token j."""
    if isinstance(prompt_lengths, Tensor):
        prompt_lengths, response_lengths = prompt_lengths.tolist(), response_lengths.tolist()
    host_sizes = [p + max(r - 1, 0) for p, r in zip(prompt_lengths, response_lengths, strict=True)]
    total, num_scored, max_length = sum(host_sizes), sum(response_lengths), max(host_sizes, default=0)
    prompt_lengths, response_lengths = torch.tensor(prompt_lengths).long(), torch.tensor(response_lengths).long()
    sizes = torch.tensor(host_sizes).long()
    ends = sizes.cumsum(0)
    starts = ends - sizes
    device = sizes.device
    row_of_position = torch.repeat_interleave(torch.arange(sizes.numel(), device=device), sizes, output_size=total)
    position_ids = torch.arange(total, device=device) - starts[row_of_position]
    score_rows = torch.repeat_interleave(
        torch.arange(sizes.numel(), device=device), response_lengths, output_size=num_scored
    )
    score_starts = response_lengths.cumsum(0) - response_lengths
    score_columns = torch.arange(num_scored, device=device) - score_starts[score_rows]
    score_index = starts[score_rows] + prompt_lengths[score_rows] - 1 + score_columns
    cu_seqlens = torch.cat([ends.new_zeros(1), ends]).to(torch.int32)
    return PackedLayout(
        starts, position_ids, score_index, score_rows, score_columns, cu_seqlens, max_length, row_of_position
    )


class DocumentBlocks(NamedTuple):
    """Which `block_size x block_size` tiles of the packed attention matrix are computed (FlexAttention's form)."""

    num_partial: Tensor  # int32[Bq]: per query tile, how many key tiles the mask function decides within
    partial: Tensor  # int32[Bq, Bk]: their indices first, ascending (the rest is filler)
    num_full: Tensor  # int32[Bq]: per query tile, how many key tiles are wholly allowed
    full: Tensor  # int32[Bq, Bk]


def document_causal_blocks(document_ids: Tensor, block_size: int) -> DocumentBlocks:
    """The tiles of the mask "query q sees key k iff both lie in the same row and k <= q" over `S` positions
    whose row ids `document_ids` `long[S]` never decrease: a tile is skipped when no pair in it is allowed, full
    when every pair is, partial otherwise. Computed from each tile's first and last row ids, O((S / block)^2)
    (the document masking of the FlexAttention paper, Dong et al. 2024, section 3.3)."""
    total = document_ids.numel()
    count = -(-total // block_size)
    device = document_ids.device
    starts = torch.arange(count, device=device) * block_size
    ends = (starts + block_size).clamp(max=total) - 1
    first, last = document_ids[starts], document_ids[ends]
    q, k = torch.arange(count, device=device)[:, None], torch.arange(count, device=device)[None, :]
    # rows are contiguous: the tiles share a row iff their row-id intervals overlap; k-tile < q-tile is causal
    some = (k <= q) & (first[None, :] <= last[:, None]) & (first[:, None] <= last[None, :])
    whole = (ends - starts + 1 == block_size) & (first == last)  # one row throughout, no ragged end
    full = (k < q) & whole[:, None] & whole[None, :] & (first[:, None] == first[None, :])
    return DocumentBlocks(*_listed(some & ~full), *_listed(full))


def _listed(tiles: Tensor) -> tuple[Tensor, Tensor]:
    """Per row of `bool[Bq, Bk]`: the count of True tiles, and their column indices first in ascending order."""
    order = torch.argsort((~tiles).to(torch.int8), dim=1, stable=True)
    return tiles.sum(1).to(torch.int32), order.to(torch.int32)


def block_causal_mask(position_ids: Tensor, dtype: torch.dtype) -> Tensor:
    """`[1, 1, S, S]` additive mask of a packed sequence: position q sees position k iff both lie in the same row
    and k <= q (rows start where the position ids restart at 0). For models that do not build one themselves."""
    row = (position_ids == 0).cumsum(0)
    index = torch.arange(position_ids.numel(), device=position_ids.device)
    allowed = (row[:, None] == row[None, :]) & (index[None, :] <= index[:, None])
    mask = torch.zeros(allowed.shape, dtype=dtype, device=position_ids.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)[None, None]

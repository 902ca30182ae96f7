"""`document_causal_blocks`: the tiles of the packed-rows mask (same row, causal), against the dense mask."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.core.packing import document_causal_blocks


def _tiles(counts, indices, num_tiles):
    out = torch.zeros(len(counts), num_tiles, dtype=torch.bool)
    for q, count in enumerate(counts.tolist()):
        out[q, indices[q, :count].long()] = True
    return out


def test_tiles_by_hand():
    # rows of 5, 3 and 4 positions, tiles of 4: [0 0 0 0 | 0 1 1 1 | 2 2 2 2]
    blocks = document_causal_blocks(torch.tensor([0] * 5 + [1] * 3 + [2] * 4), block_size=4)
    partial = _tiles(blocks.num_partial, blocks.partial, 3)
    full = _tiles(blocks.num_full, blocks.full, 3)
    # the diagonal tiles are partial (causal inside); tile 1 sees the end of row 0 in tile 0 only partly
    # (its row-1 queries see nothing there); tile 2 (row 2) sees nothing before it
    assert partial.tolist() == [[True, False, False], [True, True, False], [False, False, True]]
    assert not full.any()
    # one row throughout: the tiles below the diagonal are full
    blocks = document_causal_blocks(torch.zeros(12, dtype=torch.long), block_size=4)
    assert _tiles(blocks.num_full, blocks.full, 3).tolist() == [[False] * 3, [True] + [False] * 2, [True] * 2 + [False]]
    assert _tiles(blocks.num_partial, blocks.partial, 3).tolist() == [[i == j for j in range(3)] for i in range(3)]


@pytest.mark.parametrize("seed", range(6))
def test_tiles_agree_with_the_dense_mask(seed):
    """A tile is skipped iff no pair in it is allowed, full iff every pair is (a ragged last tile is never full)."""
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 12, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g)
    doc = torch.repeat_interleave(torch.arange(len(sizes)), sizes)
    block = int(torch.randint(2, 6, (1,), generator=g))
    total, num_tiles = doc.numel(), -(-doc.numel() // block)
    index = torch.arange(total)
    allowed = (doc[:, None] == doc[None, :]) & (index[None, :] <= index[:, None])
    blocks = document_causal_blocks(doc, block)
    partial = _tiles(blocks.num_partial, blocks.partial, num_tiles)
    full = _tiles(blocks.num_full, blocks.full, num_tiles)
    assert not (partial & full).any()
    for q in range(num_tiles):
        for k in range(num_tiles):
            tile = allowed[q * block : (q + 1) * block, k * block : (k + 1) * block]
            ragged = tile.shape != (block, block)
            assert bool(partial[q, k] | full[q, k]) == bool(tile.any()), (q, k)
            assert bool(full[q, k]) == (bool(tile.all()) and not ragged), (q, k)

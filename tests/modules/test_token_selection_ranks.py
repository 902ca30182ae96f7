"""The pick of a token-selecting loss over a mini-batch split across two data-parallel ranks (gloo, two processes)
is the pick of one process holding the whole mini-batch: each rank gets its own slice of it. So are BAPO's bounds,
searched over the whole mini-batch (each token's bound, for a loss that reads a value per token)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlvr_lightning.core.losses.policy_losses import BAPO, ClipCov, HighEntropyTokens, KLCov
from rlvr_lightning.modules.update.token_selection import SelectionInputs, select_over_mini_batch

LOSSES = {
    "clip_cov": lambda: ClipCov(clip_cov_ratio=0.2, clip_cov_lb=0.0, clip_cov_ub=100.0),
    "kl_cov": lambda: KLCov(kl_cov_ratio=0.1),
    "high_entropy": lambda: HighEntropyTokens(top_quantile=0.3),
    "bapo": lambda: BAPO(target=0.7),  # whole: c_high 1.55; rank 1 alone: both bounds at their ranges' ends
}


def micro_batches(rank: int, rows: int = 3, tokens: int = 6) -> list[SelectionInputs]:
    """Two micro-batches of uneven lengths for `rank`, different on each rank (rank 1 has more tokens)."""
    parts = []
    for index in range(2):
        generator = torch.Generator().manual_seed(10 * rank + index)
        log_probs = -3 * torch.rand(rows + rank, tokens, generator=generator)
        old = log_probs + 0.3 * torch.randn(log_probs.shape, generator=generator)
        advantages = torch.randn(rows + rank, generator=generator)
        mask = torch.arange(tokens) < torch.randint(1, tokens + 1, (rows + rank, 1), generator=generator)
        entropy = (1 + 2 * rank) * torch.rand(log_probs.shape, generator=generator)  # rank 1: higher entropies
        parts.append(SelectionInputs(log_probs, old, advantages, mask, entropy))
    return parts


def _rank(rank: int, port: int, folder: Path) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        picks = {}
        for name, loss in LOSSES.items():
            torch.manual_seed(rank)  # only rank 0's RNG seeds the shared random pick
            picks[name] = [s.tolist() for s in select_over_mini_batch(loss(), micro_batches(rank))]
        (folder / f"rank{rank}.json").write_text(json.dumps(picks))
    finally:
        dist.destroy_process_group()


def read_picks(folder: Path, rank: int) -> dict[str, list]:
    return json.loads((folder / f"rank{rank}.json").read_text())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_ranks_pick_as_one_process_holding_their_tokens(tmp_path):
    # each rank writes its picks to a file (a Manager would fork a server from this threaded process)
    mp.spawn(_rank, args=(_free_port(), tmp_path), nprocs=2, join=True)
    results = {(name, rank): picks for rank in (0, 1) for name, picks in read_picks(tmp_path, rank).items()}
    for name, loss in LOSSES.items():
        torch.manual_seed(0)
        whole = select_over_mini_batch(loss(), micro_batches(0) + micro_batches(1))
        assert results[name, 0] == [s.tolist() for s in whole[:2]], name
        assert results[name, 1] == [s.tolist() for s in whole[2:]], name
        if name == "bapo":
            assert {round(v, 4) for s in whole for v in s.flatten().tolist()} == {0.0, 0.6, 1.55}
        else:
            picked = sum(int(s.sum()) for s in whole)
            assert 0 < picked < sum(int(part.mask.sum()) for part in micro_batches(0) + micro_batches(1)), name
        # each rank alone would pick otherwise: the gather matters
        torch.manual_seed(0)
        assert [s.tolist() for s in select_over_mini_batch(loss(), micro_batches(1))] != results[name, 1], name

"""`raise_recompile_limit` raises dynamo's per-function graph limit under either of its names (torch 2.7 renamed
`cache_size_limit` to `recompile_limit`) and never lowers it."""

from __future__ import annotations

import types

import torch

from rlvr_lightning.runtime.recompile_limit import raise_recompile_limit


def test_the_limit_is_raised_under_the_name_this_torch_has(monkeypatch):
    old_torch = types.SimpleNamespace(cache_size_limit=8)  # torch 2.6: the old name only
    monkeypatch.setattr(torch._dynamo, "config", old_torch)
    raise_recompile_limit(64)
    assert old_torch.cache_size_limit == 64 and not hasattr(old_torch, "recompile_limit")
    new_torch = types.SimpleNamespace(recompile_limit=100, cache_size_limit=100)
    monkeypatch.setattr(torch._dynamo, "config", new_torch)
    raise_recompile_limit(64)
    assert new_torch.recompile_limit == 100  # a higher setting is kept


def test_this_torch_takes_it():
    limit = torch._dynamo.config.recompile_limit
    try:
        raise_recompile_limit(limit + 1)
        assert torch._dynamo.config.recompile_limit == limit + 1
    finally:
        torch._dynamo.config.recompile_limit = limit

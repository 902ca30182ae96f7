"""`raise_recompile_limit` raises dynamo's per-function graph limit and never lowers it."""

from __future__ import annotations

import torch

from rlvr_lightning.runtime.recompile_limit import raise_recompile_limit


def test_the_limit_is_raised_and_never_lowered():
    limit = torch._dynamo.config.recompile_limit
    try:
        raise_recompile_limit(limit + 1)
        assert torch._dynamo.config.recompile_limit == limit + 1
        raise_recompile_limit(limit)
        assert torch._dynamo.config.recompile_limit == limit + 1  # a higher setting is kept
    finally:
        torch._dynamo.config.recompile_limit = limit

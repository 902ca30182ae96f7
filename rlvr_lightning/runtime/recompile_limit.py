"""`raise_recompile_limit`: how many graphs dynamo may compile per function before it runs the function eagerly.

A compiled decoding step or decoder layer legitimately needs more than dynamo's default of 8 over a run (a graph
per row bucket, sampling setting, input shape kind or grad mode). torch 2.7 renamed the setting from
`cache_size_limit` to `recompile_limit`; transformers 5 runs on torch 2.6, which has only the old name.
"""

from __future__ import annotations

import torch


def raise_recompile_limit(limit: int) -> None:
    """Let dynamo compile at least `limit` graphs per function (a higher setting is kept)."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), limit))

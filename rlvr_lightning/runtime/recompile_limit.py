"""`raise_recompile_limit`: how many graphs dynamo may compile per function before it runs the function eagerly.

A compiled decoding step or decoder layer legitimately needs more than dynamo's default of 8 over a run (a graph
per row bucket, sampling setting, input shape kind or grad mode).
"""

from __future__ import annotations

import torch


def raise_recompile_limit(limit: int) -> None:
    """Let dynamo compile at least `limit` graphs per function (a higher setting is kept)."""
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, limit)

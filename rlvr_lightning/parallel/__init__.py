"""Sharded training (FSDP2 through Lightning's `ModelParallelStrategy`); see `fsdp.py` and `strategy.py`."""

from rlvr_lightning.parallel.fsdp import (
    ShardingOptions,
    full_state_dict,
    gathered_params,
    shard_for_training,
    shard_policy,
    transformer_blocks,
)
from rlvr_lightning.parallel.strategy import FSDP2Strategy

__all__ = [
    "FSDP2Strategy",
    "ShardingOptions",
    "full_state_dict",
    "gathered_params",
    "shard_for_training",
    "shard_policy",
    "transformer_blocks",
]

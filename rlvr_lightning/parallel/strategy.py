"""`FSDP2Strategy` (`strategy: fsdp2`): Lightning's `ModelParallelStrategy` used for FSDP2 only.

Lightning's strategy builds a 2-D (data-parallel x tensor-parallel) device mesh whose defaults
put every process of a node on the tensor-parallel axis. rlvr_lightning shards with FSDP2 and no
tensor parallelism, so this strategy makes the whole world the data-parallel axis, takes the
`fully_shard` settings (`ShardingOptions`: mixed precision, resharding, CPU offload) that the
modules' `configure_model` applies, and writes sharded checkpoints so that a crash cannot leave a
half-written one in place of the last good one.

    trainer:
      strategy:
        class_path: rlvr_lightning.parallel.FSDP2Strategy
        init_args: {param_dtype: bfloat16, reduce_dtype: float32}
      # or simply: strategy: fsdp2

Checkpoints (`save_distributed_checkpoint`): True (default) writes a directory of per-rank shards
(torch.distributed.checkpoint) plus `meta.pt` (loops, callbacks, data module state); resuming needs
the same world size for bitwise results, and `rlvr export` turns it into a Hugging Face directory.
False gathers a single `.ckpt` file on rank 0 (written atomically by `AtomicCheckpointIO`).
"""

from __future__ import annotations

import os
import shutil
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry

from rlvr_lightning.parallel.fsdp import ShardingOptions
from rlvr_lightning.runtime.checkpoint_files import fsync_directory

DType = Literal["float32", "bfloat16", "float16"]


class FSDP2Strategy(ModelParallelStrategy):
    def __init__(
        self,
        param_dtype: DType | None = None,
        reduce_dtype: DType | None = None,
        reshard_after_forward: bool = True,
        cpu_offload: bool = False,
        save_distributed_checkpoint: bool = True,
        data_parallel_size: Literal["auto"] | int = "auto",
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
    ) -> None:
        """
        Args:
            param_dtype, reduce_dtype, reshard_after_forward, cpu_offload: `fully_shard`'s settings, see
                `rlvr_lightning.parallel.fsdp.ShardingOptions`.
            save_distributed_checkpoint: a directory of per-rank shards (True) or one full `.ckpt` file (False).
            data_parallel_size: processes that shard the model ("auto": all of them).
            process_group_backend: None: NCCL on GPUs ("cuda:nccl,cpu:gloo" with `cpu_offload`), gloo on CPUs.
        """
        super().__init__(
            data_parallel_size=data_parallel_size,
            tensor_parallel_size=1,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )
        self.sharding_options = ShardingOptions(
            param_dtype=param_dtype,
            reduce_dtype=reduce_dtype,
            reshard_after_forward=reshard_after_forward,
            cpu_offload=cpu_offload,
        )

    def setup_environment(self) -> None:
        if self._data_parallel_size == "auto":
            self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()

    def _get_process_group_backend(self) -> str:
        if (
            self._process_group_backend is None
            and self.sharding_options.cpu_offload
            and self.root_device.type == "cuda"
        ):
            # offloaded gradients and parameters are CPU tensors: their collectives (the gradient norm, clipping,
            # checkpoints) need a CPU backend beside NCCL, as torchtitan sets up for CPU offload
            return "cuda:nccl,cpu:gloo"
        return super()._get_process_group_backend()

    def model_to_device(self) -> None:
        if self.sharding_options.cpu_offload:
            return  # fully_shard placed the sharded parameters in CPU memory: moving the module would undo it
        super().model_to_device()

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options: Any | None = None) -> None:
        """Sharded checkpoints are written to a fresh sibling directory, which then replaces `filepath`
        (Lightning writes into `filepath` in place: a crash mid-write would leave old and new shards mixed)."""
        if not self._save_distributed_checkpoint:
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        path = Path(self.broadcast(str(filepath)))
        token = self.broadcast(uuid.uuid4().hex)
        staging = path.parent / f".{path.name}.{token}.partial"
        try:
            super().save_checkpoint(checkpoint, staging, storage_options)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)  # the previous checkpoint at `path` is untouched
            raise
        self.barrier()
        if self.is_global_zero:
            _fsync_tree(staging)
            previous = path.parent / f".{path.name}.{token}.old"
            if path.exists():
                os.replace(path, previous)  # kept until the new one is in place
            os.replace(staging, path)
            fsync_directory(path.parent)
            if previous.is_dir():
                shutil.rmtree(previous)
            elif previous.exists():
                previous.unlink()
        self.barrier()


def _fsync_tree(directory: Path) -> None:
    """fsync every file of `directory` (torch.distributed.checkpoint syncs its shards; `meta.pt` is not) and it."""
    for item in directory.iterdir():
        if item.is_file():
            with open(item, "rb") as f:
                os.fsync(f.fileno())
    fsync_directory(directory)


if "fsdp2" not in StrategyRegistry:
    StrategyRegistry.register(
        "fsdp2", FSDP2Strategy, description="FSDP2 (fully_shard per transformer block) over all processes"
    )

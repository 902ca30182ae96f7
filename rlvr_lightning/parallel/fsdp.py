"""FSDP2 for the training modules: `fully_shard` per transformer block, applied in `configure_model`.

Lightning's `ModelParallelStrategy` (or `FSDP2Strategy`, its FSDP-only form in `parallel/strategy.py`)
builds the device mesh and calls the module's `configure_model`, which calls `shard_for_training` to
shard there:

* the policy: every transformer block (the classes a Hugging Face model lists in `_no_split_modules`)
  is one FSDP unit, then the policy's network as the root unit. The root is the module the policy
  calls: `policy.model` when that holds all of its parameters (`HFPolicy`), else the policy itself
  (`ToySortPolicy`, whose `sample` and `token_log_probs` run its `forward`). FSDP2's forward hooks
  on those modules all-gather parameters for every forward, so scoring code needs no change;
* an untied float32 output layer (`model.lm_head_fp32`) is a unit of its own, gathered and reduced in float32
  whatever `param_dtype` says;
* the KL reference, when it holds weights, the same way (it then costs 1/world_size of a copy per
  rank); it reshards after every forward, since it never runs backward.

Sampling runs many small forwards (one per generated token), and each rank generates for its own
prompts, so ranks make different numbers of them: per-forward all-gathers would both be slow and
pair up wrongly across ranks. `gathered_params(policy)` therefore unshards every unit once, keeps
them unsharded through the whole sampling phase, and reshards at the end: the only collectives
are the all-gathers at its start, the same on every rank. The full policy must fit on one device
while it samples (as with Hugging Face generation under any FSDP).

`full_state_dict(module)` assembles the full tensors of a sharded module (a checkpoint export or a
weight push to an inference engine).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rlvr_lightning.core.float32_head import Float32Head
from rlvr_lightning.runtime.devices import set_compute_device

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# the reshard_after_forward each FSDP unit was created with, restored after sampling
_RESHARD_AFTER_FORWARD: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()
# a sharded policy's FSDP units, root first (gathered_params looks them up instead of walking the modules)
_UNITS: weakref.WeakKeyDictionary[nn.Module, list[nn.Module]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class ShardingOptions:
    """How `fully_shard` is applied (`FSDP2Strategy` takes these as its arguments).

    param_dtype, reduce_dtype: FSDP2's mixed precision (`MixedPrecisionPolicy`): parameters are kept
        sharded in their own dtype and all-gathered in `param_dtype` for compute; gradients are
        reduce-scattered in `reduce_dtype`. None: the parameters' dtype.
    reshard_after_forward: free a block's gathered parameters after its forward and gather them
        again for backward (ZeRO-3); False keeps them until backward (ZeRO-2-like: less
        communication, more memory).
    cpu_offload: keep sharded parameters, gradients and optimizer state in CPU memory
        (`CPUOffloadPolicy`); the optimizer then steps on the CPU.
    """

    param_dtype: str | None = None
    reduce_dtype: str | None = None
    reshard_after_forward: bool = True
    cpu_offload: bool = False

    def __post_init__(self) -> None:
        for name in ("param_dtype", "reduce_dtype"):
            value = getattr(self, name)
            if value is not None and value not in DTYPES:
                raise ValueError(f"{name}={value!r} is not valid; choose one of {sorted(DTYPES)} or null")

    def fsdp_kwargs(self) -> dict:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

        mixed_precision = MixedPrecisionPolicy(
            param_dtype=DTYPES.get(self.param_dtype), reduce_dtype=DTYPES.get(self.reduce_dtype)
        )
        offload = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if self.cpu_offload else OffloadPolicy()
        return {"mp_policy": mixed_precision, "offload_policy": offload}


# ----------------------------------------------------------------------------- what is sharded


def transformer_blocks(module: nn.Module) -> list[nn.Module]:
    """The outermost submodules whose class a Hugging Face model names in `_no_split_modules`
    (`LlamaDecoderLayer`, `Qwen2DecoderLayer`, ...): the units FSDP shards one at a time."""
    names: set[str] = set()
    for submodule in module.modules():
        names.update(getattr(submodule, "_no_split_modules", None) or ())
    blocks: list[nn.Module] = []
    inside: set[int] = set()
    for submodule in module.modules():  # pre-order: an enclosing block comes before its children
        if id(submodule) in inside:
            continue
        if type(submodule).__name__ in names:
            blocks.append(submodule)
            inside.update(id(child) for child in submodule.modules())
    return blocks


def network_root(policy: nn.Module) -> nn.Module:
    """The module a policy runs: `policy.model` when it holds every parameter of the policy, else the policy."""
    model = getattr(policy, "model", None)
    if isinstance(model, nn.Module):
        inner = {id(p) for p in model.parameters()}
        if all(id(p) in inner for p in policy.parameters()):
            return model
    return policy


def is_sharded(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in module.modules())


def shard_policy(policy: nn.Module, mesh, options: ShardingOptions, root_reshard_after_forward: bool) -> None:
    """`fully_shard` every transformer block of `policy`, then its network root, over the 1-D `mesh`."""
    from torch.distributed.fsdp import fully_shard

    if is_sharded(policy):  # configure_model runs again for a later trainer.fit / validate
        return
    if getattr(policy, "share_prompt_prefix", False) is not False:  # None: by device, so on for a CPU
        # HFPolicy decides per batch between one forward and two (prompt prefix, then responses): ranks would
        # run different numbers of forwards, i.e. of all-gathers and reduce-scatters, and wait on each other
        policy.share_prompt_prefix = False
        log.info("FSDP2: %s scores with one forward per call (share_prompt_prefix off)", type(policy).__name__)
    if getattr(policy, "decoder_only_hidden_states", False):
        # the decoder alone would run without the root unit's forward, which gathers the embeddings and final norm
        policy.decoder_only_hidden_states = False
    kwargs = options.fsdp_kwargs()
    blocks = transformer_blocks(policy) + untied_float32_heads(policy)
    for block in blocks:
        unit_kwargs = float32_unit_kwargs(kwargs) if isinstance(block, Float32Head) else kwargs
        fully_shard(block, mesh=mesh, reshard_after_forward=options.reshard_after_forward, **unit_kwargs)
        _RESHARD_AFTER_FORWARD[block] = options.reshard_after_forward
    root = network_root(policy)
    fully_shard(root, mesh=mesh, reshard_after_forward=root_reshard_after_forward, **kwargs)
    _RESHARD_AFTER_FORWARD[root] = root_reshard_after_forward
    _UNITS[policy] = [root, *blocks]


def untied_float32_heads(policy: nn.Module) -> list[nn.Module]:
    """The float32 output layers of `policy` (`model.lm_head_fp32`, `core/float32_head.py`) whose weight no other
    module shares: each is its own unit, gathered in float32 (a tied one stays in the root unit with the
    embeddings, gathered in `param_dtype` and upcast for its GEMM)."""
    uses: dict[int, int] = {}
    for _, parameter in policy.named_parameters(remove_duplicate=False):
        uses[id(parameter)] = uses.get(id(parameter), 0) + 1
    heads = [m for m in policy.modules() if isinstance(m, Float32Head)]
    return [head for head in heads if all(uses[id(p)] == 1 for p in head.parameters())]


def float32_unit_kwargs(kwargs: dict) -> dict:
    """`fully_shard`'s `kwargs` for a float32 output layer's unit: gathered and reduced in float32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return {**kwargs, "mp_policy": MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)}


def shard_unit(module: nn.Module, mesh, options: ShardingOptions) -> None:
    """`fully_shard` `module` as one unit over the 1-D `mesh` (nothing when it already is)."""
    from torch.distributed.fsdp import fully_shard

    if not is_sharded(module):
        fully_shard(module, mesh=mesh, reshard_after_forward=options.reshard_after_forward, **options.fsdp_kwargs())


def sharding_options(strategy) -> ShardingOptions:
    return getattr(strategy, "sharding_options", None) or ShardingOptions()


def data_parallel_mesh(pl_module):
    """The 1-D data-parallel mesh of a `ModelParallelStrategy` run; None under any other strategy."""
    mesh = getattr(pl_module, "device_mesh", None)
    if mesh is None:
        return None
    names = mesh.mesh_dim_names or ()
    if "tensor_parallel" in names and mesh["tensor_parallel"].size() > 1:
        raise ValueError(
            f"the device mesh has tensor_parallel_size={mesh['tensor_parallel'].size()}, but rlvr_lightning shards "
            "with FSDP2 only (no tensor parallelism): use `strategy: fsdp2`, or ModelParallelStrategy with "
            "data_parallel_size: <number of processes> and tensor_parallel_size: 1"
        )
    return mesh["data_parallel"] if "data_parallel" in names else mesh


def shard_for_training(pl_module, policy: nn.Module, reference: nn.Module | None = None) -> None:
    """The training modules' `configure_model` (`modules/policy_module.py`): record the strategy's root device as
    where the modules compute (`policies.base.compute_device`) under every strategy; under
    `ModelParallelStrategy` / `FSDP2Strategy` also shard `policy` and, when it holds weights, `reference`."""
    strategy = getattr(pl_module.trainer, "strategy", None)
    if strategy is not None:
        set_compute_device(pl_module, strategy.root_device)
    mesh = data_parallel_mesh(pl_module)
    if mesh is None:
        return
    options = sharding_options(strategy)
    shard_policy(policy, mesh, options, root_reshard_after_forward=False)
    if reference is not None and any(True for _ in reference.parameters()):
        shard_policy(reference, mesh, options, root_reshard_after_forward=True)
    evaluate_without_inference_mode(pl_module.trainer)


def evaluate_without_inference_mode(trainer) -> None:
    """Lightning's `validate`, `test` and `predict` run under `torch.inference_mode` (except on gloo); FSDP2
    allocates its all-gather buffers at a unit's first unshard and reuses them, and made there they are
    inference tensors that no later unshard may use ("Inference tensors do not track version counter"). The
    loops then run under `no_grad`, as Lightning runs them for its own FSDPStrategy."""
    for loop in (trainer.validate_loop, trainer.test_loop, trainer.predict_loop):
        loop.inference_mode = False


# ----------------------------------------------------------------------------- sampling


@contextmanager
def gathered_params(policy: nn.Module) -> Iterator[None]:
    """Unshard every FSDP unit of `policy` once, keep them unsharded for everything inside (any number of
    `policy.sample` calls), reshard at the end. Does nothing for a policy `shard_policy` did not shard.

    Every rank must enter it at the same point (it all-gathers), as every rank runs the same training
    step, validation batch or curriculum refresh."""
    units = _UNITS.get(policy)
    if not units:  # not sharded (DDP, one device): nothing to do, and cheap on every step
        yield
        return
    from torch.distributed.fsdp import fully_shard

    fully_shard.state(units[0])._lazy_init()  # as the root's first forward would (no collective); idempotent
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.set_reshard_after_forward(_RESHARD_AFTER_FORWARD.get(unit, True), recurse=False)
            unit.reshard()


def reshard_policy(policy: nn.Module) -> None:
    """Reshard every unit of a sharded `policy` (nothing otherwise): its root keeps its gathered parameters after a
    forward until the backward, and code that reads the parameters themselves (an EMA over them) needs the shards.
    Local to each rank (no collective); the next forward gathers again."""
    for unit in _UNITS.get(policy, ()):
        unit.reshard()


# ----------------------------------------------------------------------------- full weights


def full_state_dict(module: nn.Module, device: torch.device | str | None = None) -> dict[str, Tensor]:
    """`module.state_dict()` with every sharded tensor (DTensor) assembled into a full plain tensor, on
    every rank (a collective: call it on all ranks, in the same order). `device`: where the tensors go
    (default: where they are). Tensors that were not sharded are the module's own, detached, not copies."""
    from torch.distributed.tensor import DTensor

    state = {}
    for name, value in module.state_dict().items():
        if isinstance(value, DTensor):
            value = value.full_tensor()
        value = value.detach()
        state[name] = value if device is None else value.to(device)
    return state

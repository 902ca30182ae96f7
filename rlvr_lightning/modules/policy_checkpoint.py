"""`policy_from_checkpoint`: a policy with the weights of an earlier stage (SFT, then GRPO or expert iteration)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from rlvr_lightning.policies.base import Policy

log = logging.getLogger(__name__)


def policy_from_checkpoint(
    policy: Policy, checkpoint_path: str, strict: bool = True, weights_only: bool = True
) -> Policy:
    """`policy` with the weights of an earlier stage loaded into it (use it wherever a policy goes):

        policy:
          class_path: rlvr_lightning.modules.sft.policy_from_checkpoint
          init_args:
            checkpoint_path: runs/sft/sft.ckpt
            policy:
              class_path: rlvr_lightning.policies.toy_sort.ToySortPolicy
              init_args: {...}   # the same architecture as the checkpoint's

    `checkpoint_path` is a Lightning checkpoint of any module that keeps its policy as `self.policy`
    (SFTModule, ExpertIterationModule, RLVRModule: the `policy.*` weights are taken, a KL reference
    is not; a `.ckpt` file or the directory of shards of a sharded run) or a plain `policy.state_dict()`
    saved with `torch.save`. Only the weights are loaded:
    the new run starts at step 0 with a fresh optimizer (unlike `--ckpt_path`, which resumes a run).
    `weights_only=False` is needed for checkpoints that hold Python objects (load only checkpoints you trust
    then); the modules keep their options as plain data.
    """
    path = Path(checkpoint_path)
    if path.is_dir():  # a sharded (FSDP2) run's checkpoint
        from rlvr_lightning.runtime.checkpoint_files import read_sharded_weights

        state = read_sharded_weights(path, {f"policy.{k}": v for k, v in policy.state_dict().items()})
        policy.load_state_dict({k.removeprefix("policy."): v for k, v in state.items()}, strict=strict)
        log.info("loaded policy weights from the sharded checkpoint %s", checkpoint_path)
        return policy
    if not path.is_file():
        raise FileNotFoundError(f"policy_from_checkpoint: checkpoint_path={checkpoint_path!r} does not exist")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=weights_only)
    except Exception as error:
        hint = "" if not weights_only else " (if it holds Python objects and you trust it, set weights_only: false)"
        raise RuntimeError(f"policy_from_checkpoint: cannot read {checkpoint_path!r}{hint}: {error}") from error
    state = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict):
        raise ValueError(
            f"policy_from_checkpoint: {checkpoint_path!r} holds neither a Lightning checkpoint nor a state dict"
        )
    if any(key.startswith("policy.") for key in state):
        state = {key.removeprefix("policy."): value for key, value in state.items() if key.startswith("policy.")}
    try:
        policy.load_state_dict(state, strict=strict)
    except RuntimeError as error:
        raise RuntimeError(
            f"policy_from_checkpoint: the weights in {checkpoint_path!r} do not fit {type(policy).__name__} "
            f"(configure the same architecture as the stage that wrote them): {error}"
        ) from error
    log.info("loaded policy weights from %s", checkpoint_path)
    return policy

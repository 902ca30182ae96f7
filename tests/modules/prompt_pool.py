"""Runs over a pool of 8 sort prompts read several times, for the estimators that keep state per prompt: in this
process (`pool_fit`), or under 2-process DDP (`pool_ddp_config`), and hand-made rollouts (`rollout_of`)."""

from __future__ import annotations

import lightning.pytorch as pl
import torch

from rlvr_lightning.data import RLVRDataModule, SortTask
from rlvr_lightning.rewards import SortInclusionOrderingReward
from rlvr_lightning.rollout import Rollout

from .test_algorithm_options import UpdateSpy
from .test_rlvr_module import policy

POOL = 8  # prompts, 4 a step


def pool_fit(estimator, epochs=4, group_size=1, policy_=None, **module_options):
    """`UpdateSpy` trained `epochs` passes over the pool (2 steps each) with `estimator`; the module and trainer."""
    pl.seed_everything(0)
    module = UpdateSpy(policy_ or policy(), group_size=group_size, **module_options)
    data = RLVRDataModule(SortTask(vocab_size=5, length=3, num_train=POOL, num_val=0), batch_size=4)
    trainer = pl.Trainer(
        max_epochs=epochs,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[SortInclusionOrderingReward(), estimator],
    )
    trainer.fit(module, data)
    return module, trainer


def rollout_of(prompts: list[list[int]], rewards: list[float], group_size: int, pad: int = 0) -> Rollout:
    """A rollout of `prompts` (each `group_size` rows, left-padded by `pad`) with one-token responses and `rewards`."""
    rows = [prompt for prompt in prompts for _ in range(group_size)]
    n = len(rows)
    rollout = Rollout(
        prompt_ids=torch.tensor([[0] * pad + row for row in rows]),
        prompt_mask=torch.tensor([[0] * pad + [1] * len(row) for row in rows]),
        response_ids=torch.zeros(n, 1, dtype=torch.long),
        response_mask=torch.ones(n, 1),
        group_index=torch.arange(n) // group_size,
        group_size=group_size,
        truncated=torch.zeros(n, dtype=torch.bool),
    )
    rollout.reward = torch.tensor(rewards, dtype=torch.float32)
    return rollout


def pool_ddp_config(out, estimator: str, recorder: str, group_size: int, extra: str = "") -> str:
    """A 2-rank `rlvr fit` config: 3 passes over the pool, 2 prompts a rank a step, with the advantage callback
    `estimator` (its YAML mapping, flow style) and the callback `recorder` (`module.Class`, given `out`)."""
    return f"""
seed_everything: 0
trainer:
  strategy: ddp
  accelerator: cpu
  devices: 2
  max_epochs: 3
  limit_val_batches: 0
  enable_progress_bar: false
  enable_model_summary: false
  enable_checkpointing: false
  logger: false
  callbacks:
    - class_path: rlvr_lightning.rewards.SortInclusionOrderingReward
    - {estimator}
    - {{class_path: {recorder}, init_args: {{out: {out}}}}}
model:
  class_path: rlvr_lightning.modules.RLVRModule
  init_args:
    policy:
      class_path: rlvr_lightning.policies.ToySortPolicy
      init_args: {{vocab_size: 5, prompt_length: 3, embedding_dim: 4}}
    group_size: {group_size}
{extra}data:
  class_path: rlvr_lightning.data.RLVRDataModule
  init_args:
    batch_size: 2
    task:
      class_path: rlvr_lightning.data.SortTask
      init_args: {{vocab_size: 5, length: 3, num_train: {POOL}, num_val: 0}}
"""

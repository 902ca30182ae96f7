"""Distillation under FSDP2 (one process over gloo, as tests/test_sharding.py): the teacher is sharded as the KL
reference is, and scores the first rollout as the unsharded teacher does."""

from __future__ import annotations

import copy

import lightning.pytorch as pl
import torch

from rlvr_lightning.data import RLVRDataModule, SortTask
from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.rewards import SortInclusionOrderingReward

from .modules.test_rlvr_module import MetricsRecorder
from .test_sharding import _trainer, one_process_group  # noqa: F401 (a fixture)


def fit(strategy: str) -> tuple[RLVRModule, list[dict]]:
    torch.manual_seed(0)
    student = ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=8)
    teacher = copy.deepcopy(student)
    with torch.no_grad():
        for p in teacher.parameters():
            p.add_(torch.randn_like(p))
    pl.seed_everything(0)
    module = RLVRModule(student, group_size=4, teacher=teacher)
    recorder = MetricsRecorder()
    options = dict(limit_train_batches=2, limit_val_batches=0)
    if strategy == "fsdp2":
        trainer = _trainer(SortInclusionOrderingReward(), **options)
        trainer.callbacks.append(recorder)
    else:
        trainer = pl.Trainer(
            accelerator="cpu",
            max_epochs=1,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            callbacks=[SortInclusionOrderingReward(), recorder],
            **options,
        )
    trainer.fit(module, datamodule=RLVRDataModule(task=SortTask(vocab_size=5, length=3, num_val=0), batch_size=4))
    assert trainer.global_step == 2
    return module, recorder.steps


def test_the_teacher_is_sharded_and_scores_as_unsharded(one_process_group):  # noqa: F811
    sharded, sharded_steps = fit("fsdp2")
    assert all(type(p).__name__ == "DTensor" for p in sharded.teacher.policy.parameters())
    assert all(type(p).__name__ == "DTensor" for p in sharded.policy.parameters())
    assert not any(p.requires_grad for p in sharded.teacher.policy.parameters())
    plain, plain_steps = fit("ddp")
    assert sharded_steps[0]["train/teacher_kl"] > 0.1
    assert abs(sharded_steps[0]["train/teacher_kl"] - plain_steps[0]["train/teacher_kl"]) < 1e-5

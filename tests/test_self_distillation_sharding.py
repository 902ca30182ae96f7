"""SDPO under FSDP2 (one process over gloo, as tests/test_sharding.py): the EMA teacher copy is sharded as the KL
reference is, moves toward the sharded policy, and teaches as the unsharded run does, with the sampled-token loss
and with the logit-level one (the student's top-k found and scored through the sharded models)."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

from rlvr_lightning.data import InlineTask, RLVRDataModule
from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules import RLVRModule, SelfTeacher
from rlvr_lightning.modules.distillation import DistillationConfig
from rlvr_lightning.policies.hf import HFPolicy
from rlvr_lightning.policies.hf_options import HFModelOptions
from rlvr_lightning.rewards import ContainsReward

from .modules.test_rlvr_module import MetricsRecorder
from .test_sharding import _trainer, one_process_group  # noqa: F401 (a fixture)

EXAMPLES = [{"prompt": "What is 2+3?"}, {"prompt": "Say ab."}]


def fit(strategy: str, tokenizer, **distillation) -> tuple[RLVRModule, list[dict]]:
    torch.manual_seed(0)
    policy = HFPolicy(model=HFModelOptions(config=tiny_llama_config(), tokenizer=str(tokenizer)))
    pl.seed_everything(0)
    module = RLVRModule(
        policy,
        group_size=4,
        sampling=SamplingConfig(max_new_tokens=6),
        teacher=SelfTeacher(ema_rate=0.5),
        distillation=DistillationConfig(rl_coef=0.5, **distillation),
    )
    recorder = MetricsRecorder()
    options = dict(limit_train_batches=2, limit_val_batches=0)
    if strategy == "fsdp2":
        trainer = _trainer(ContainsReward(target="a"), **options)
        trainer.callbacks.append(recorder)
    else:
        trainer = pl.Trainer(
            accelerator="cpu",
            max_epochs=1,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            callbacks=[ContainsReward(target="a"), recorder],
            **options,
        )
    trainer.fit(module, datamodule=RLVRDataModule(task=InlineTask(examples=EXAMPLES), batch_size=2))
    assert trainer.global_step == 2
    return module, recorder.steps


@pytest.mark.parametrize("mode", [{}, {"mode": "topk_logits", "topk": 8, "alpha": 0.5}], ids=["sampled", "topk"])
def test_the_ema_teacher_is_sharded_and_teaches_as_unsharded(one_process_group, tmp_path, mode):  # noqa: F811
    tokenizer = save_tiny_tokenizer(tmp_path / "tokenizer")
    torch.set_num_threads(1)
    sharded, sharded_steps = fit("fsdp2", tokenizer, **mode)
    assert all(type(p).__name__ == "DTensor" for p in sharded.teacher.copy.parameters())
    assert not any(p.requires_grad for p in sharded.teacher.copy.parameters())
    plain, plain_steps = fit("ddp", tokenizer, **mode)
    assert any(step["train/taught_rows"] > 0 for step in plain_steps)
    for sharded_step, plain_step in zip(sharded_steps, plain_steps, strict=True):
        assert sharded_step["train/taught_rows"] == plain_step["train/taught_rows"]
        assert abs(sharded_step["train/teacher_kl"] - plain_step["train/teacher_kl"]) < 1e-5
    for moved, reference in zip(sharded.teacher.copy.parameters(), plain.teacher.copy.parameters(), strict=True):
        torch.testing.assert_close(moved.full_tensor(), reference, rtol=1e-4, atol=1e-6)

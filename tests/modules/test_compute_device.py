"""Tensors are built on the strategy's root device, not where the parameters are. Under FSDP2 with CPU
offload the sharded parameters stay in CPU memory while every forward runs on the GPU; the stand-in here
is a parameter on the meta device that comes first in the policy's parameters once training starts,
while the strategy (and every forward) computes on the CPU."""

from __future__ import annotations

import json

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules.options import UpdateConfig
from rlvr_lightning.policies.hf_options import HFModelOptions
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.rewards import RewardCallback
from rlvr_lightning.runtime.devices import (
    compute_device,
    set_compute_device,
)


class ParametersElsewhere(pl.Callback):
    """Between the strategy's placing of the module and its teardown: the policy's first parameter lives on
    the meta device."""

    def on_fit_start(self, trainer, pl_module):
        pl_module.policy.model.register_parameter("offloaded", nn.Parameter(torch.zeros(1, device="meta")))
        assert next(pl_module.policy.parameters()).device.type == "meta"

    def on_train_end(self, trainer, pl_module):
        del pl_module.policy.model.offloaded


class LengthReward(RewardCallback):
    def score(self, rollout):
        return rollout.response_mask.sum(-1) / rollout.response_mask.shape[1]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> str:
    return str(save_tiny_tokenizer(tmp_path_factory.mktemp("tokenizer")))


def _trainer(*callbacks) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        limit_train_batches=1,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[*callbacks, ParametersElsewhere()],
    )


def test_a_training_step_samples_and_scores_on_the_root_device(tokenizer_dir):
    from rlvr_lightning.data import RLVRDataModule
    from rlvr_lightning.data.inline_task import InlineTask
    from rlvr_lightning.modules import RLVRModule
    from rlvr_lightning.policies.hf import HFPolicy

    pl.seed_everything(0)
    policy = HFPolicy(model=HFModelOptions(config=tiny_llama_config(), tokenizer=tokenizer_dir))
    module = RLVRModule(
        policy, group_size=2, sampling=SamplingConfig(max_new_tokens=4), update=UpdateConfig(micro_batch_size=2)
    )
    task = InlineTask(examples=[{"prompt": "What is 2+3?"}, {"prompt": "The quick brown"}])
    _trainer(LengthReward()).fit(module, RLVRDataModule(task=task, batch_size=2))
    rollout = module.last_rollout
    assert {
        t.device.type for t in (rollout.prompt_ids, rollout.response_ids, rollout.group_index, rollout.advantages)
    } == {"cpu"}
    assert module.policy.device == torch.device("cpu")


def test_a_fine_tuning_step_builds_its_batch_on_the_root_device(tokenizer_dir, tmp_path):
    from rlvr_lightning.data.sft_data import SFTDataModule
    from rlvr_lightning.modules import SFTModule
    from rlvr_lightning.policies.hf import HFPolicy

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": p, "response": p[::-1]}) + "\n" for p in ("2+3?", "quick brown")))
    policy = HFPolicy(model=HFModelOptions(config=tiny_llama_config(), tokenizer=tokenizer_dir))
    trainer = _trainer()
    trainer.fit(SFTModule(policy), SFTDataModule(train_file=str(pairs), batch_size=2))
    assert trainer.global_step == 1


def test_a_recorded_compute_device_wins_over_the_parameters():
    policy = ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4)
    assert compute_device(policy) == torch.device("cpu")  # nothing recorded: where the parameters are
    set_compute_device(policy, torch.device("meta"))
    assert compute_device(policy.embedding) == torch.device("meta")  # every submodule
    assert policy._prompt_tensor([[0, 1, 2]]).device == torch.device("meta")

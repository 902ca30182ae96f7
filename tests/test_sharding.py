"""rlvr_lightning.parallel in one process: what is sharded, option errors, the no-op paths of unsharded
modules, and FSDP2Strategy's staged checkpoint writes (a world of one process over gloo; the 2-process
behaviour is tests/test_fsdp.py's)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from fsdp_support import PROMPTS, EvenTokenReward, evaluation_as_on_gpus

from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config
from rlvr_lightning.modules.options import KLConfig, ValidationConfig
from rlvr_lightning.modules.ppo_options import ValueConfig
from rlvr_lightning.parallel import (
    FSDP2Strategy,
    ShardingOptions,
    full_state_dict,
    gathered_params,
    transformer_blocks,
)
from rlvr_lightning.parallel.fsdp import data_parallel_mesh, network_root
from rlvr_lightning.policies.hf_options import HFModelOptions, LoRAOptions
from rlvr_lightning.policies.toy_sort import ToySortPolicy


@pytest.fixture(scope="module")
def hf_policy(tmp_path_factory):
    from rlvr_lightning.policies.hf import HFPolicy

    def make(**options):
        torch.manual_seed(0)
        tokenizer = save_tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))
        return HFPolicy(model=HFModelOptions(config=tiny_llama_config(), tokenizer=str(tokenizer)), **options)

    return make


def test_transformer_blocks_are_the_decoder_layers(hf_policy):
    for policy in (hf_policy(), hf_policy(lora=LoRAOptions(r=2))):
        blocks = transformer_blocks(policy)
        assert [type(b).__name__ for b in blocks] == ["LlamaDecoderLayer", "LlamaDecoderLayer"]
        assert network_root(policy) is policy.model  # the module HFPolicy calls holds every weight
    toy = ToySortPolicy()
    assert transformer_blocks(toy) == [] and network_root(toy) is toy  # runs its own forward: one unit


def test_sharding_options_name_the_bad_value():
    with pytest.raises(
        ValueError, match=r"param_dtype='fp8' is not valid; choose one of \['bfloat16', 'float16', 'float32'\]"
    ):
        ShardingOptions(param_dtype="fp8")
    kwargs = ShardingOptions(param_dtype="bfloat16", reduce_dtype="float32", cpu_offload=True).fsdp_kwargs()
    assert kwargs["mp_policy"].param_dtype == torch.bfloat16 and kwargs["mp_policy"].reduce_dtype == torch.float32
    assert type(kwargs["offload_policy"]).__name__ == "CPUOffloadPolicy"


def test_a_tensor_parallel_mesh_is_refused_with_the_fix():
    class Mesh:  # the shape of a DeviceMesh that ModelParallelStrategy builds by default on one node
        mesh_dim_names = ("data_parallel", "tensor_parallel")

        def __getitem__(self, name):
            return type("Dim", (), {"size": lambda self: 1 if name == "data_parallel" else 2})()

    module = type("Module", (), {"device_mesh": Mesh()})()
    with pytest.raises(ValueError, match="tensor_parallel_size=2.*strategy: fsdp2"):
        data_parallel_mesh(module)
    assert data_parallel_mesh(type("Module", (), {"device_mesh": None})()) is None  # DDP, one device: not sharded


def test_unsharded_modules_pass_through():
    policy = ToySortPolicy()
    with gathered_params(policy):
        pass
    state = full_state_dict(policy)
    assert state.keys() == policy.state_dict().keys()
    assert all(torch.equal(state[k], v) for k, v in policy.state_dict().items())


# ----------------------------------------------------------------------------- one-process FSDP2


@pytest.fixture
def one_process_group():
    environment = dict(os.environ)
    yield
    if torch.distributed.is_initialized():  # Lightning leaves it up; later tests expect none
        torch.distributed.destroy_process_group()
    # and it leaves LOCAL_RANK, NODE_RANK, MASTER_*: a later `rlvr fit --trainer.devices=2` subprocess
    # would then take itself for rank 0 of an externally launched job and wait for a rank 1
    os.environ.clear()
    os.environ.update(environment)


def _toy_fit(tmp_path, **strategy_options) -> pl.Trainer:
    from rlvr_lightning.callbacks import RolloutCheckpoint
    from rlvr_lightning.data import RLVRDataModule, SortTask
    from rlvr_lightning.modules import RLVRModule
    from rlvr_lightning.rewards import SortInclusionOrderingReward

    pl.seed_everything(0)
    module = RLVRModule(
        ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=8), group_size=4, kl=KLConfig(coef=0.1)
    )
    data = RLVRDataModule(task=SortTask(vocab_size=5, length=3, num_val=0), batch_size=4)
    trainer = pl.Trainer(
        strategy=FSDP2Strategy(**strategy_options),
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        limit_train_batches=2,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            SortInclusionOrderingReward(),
            RolloutCheckpoint(dirpath=tmp_path / "ckpt", every_n_rollout_steps=1, save_last=True),
        ],
    )
    trainer.fit(module, datamodule=data)
    return trainer


def test_a_failed_sharded_write_leaves_the_last_checkpoint_intact(tmp_path, monkeypatch, one_process_group):
    import lightning.pytorch.strategies.model_parallel as model_parallel

    trainer = _toy_fit(tmp_path)
    policy = trainer.lightning_module.policy
    assert all(type(p).__name__ == "DTensor" for p in policy.parameters())  # sharded over the one rank
    last = tmp_path / "ckpt" / "last.ckpt"
    before = {p.name: p.read_bytes() for p in last.iterdir()}
    assert "meta.pt" in before and ".metadata" in before

    def fail_half_way(state, path):
        (Path(path) / "__0_0.distcp").write_bytes(b"half a shard")
        raise OSError("No space left on device")

    monkeypatch.setattr(model_parallel, "_distributed_checkpoint_save", fail_half_way)
    with pytest.raises(OSError, match="No space left"):
        trainer.save_checkpoint(last)
    assert {p.name: p.read_bytes() for p in last.iterdir()} == before
    assert [p.name for p in last.parent.iterdir() if p.name.startswith(".")] == []  # the staging directory is gone


def test_lora_with_a_refreshed_reference_is_refused_before_sharding(hf_policy):
    from types import SimpleNamespace

    from rlvr_lightning.modules import PolicyModule, RLVRModule

    class Mesh:
        mesh_dim_names = ("data_parallel",)

        def __getitem__(self, name):
            return self

    policy = hf_policy(lora=LoRAOptions(r=2))
    module = SimpleNamespace(
        device_mesh=Mesh(),
        trainer=SimpleNamespace(strategy=None),
        policy=policy,
        reference=None,
        loss_module=None,
        kl=SimpleNamespace(refresh_every=5),
        async_rollouts=None,
    )
    module.check_sharding = lambda: RLVRModule.check_sharding(module)
    with pytest.raises(NotImplementedError, match="kl.refresh_every: null"):
        PolicyModule.configure_model(module)
    assert not any(type(p).__name__ == "DTensor" for p in policy.parameters())


def test_fsdp2_is_a_strategy_name():
    from lightning.pytorch.strategies import StrategyRegistry

    assert StrategyRegistry["fsdp2"]["strategy"] is FSDP2Strategy
    assert FSDP2Strategy()._tensor_parallel_size == 1


def test_cpu_offload_on_gpus_gives_the_cpu_tensors_a_gloo_backend(monkeypatch):
    monkeypatch.setattr(FSDP2Strategy, "root_device", property(lambda self: torch.device("cuda", 0)))
    assert FSDP2Strategy(cpu_offload=True)._get_process_group_backend() == "cuda:nccl,cpu:gloo"
    assert FSDP2Strategy()._get_process_group_backend() == "nccl"
    assert FSDP2Strategy(cpu_offload=True, process_group_backend="nccl")._get_process_group_backend() == "nccl"
    monkeypatch.setattr(FSDP2Strategy, "root_device", property(lambda self: torch.device("cpu")))
    assert FSDP2Strategy(cpu_offload=True)._get_process_group_backend() == "gloo"


def _toy_module_and_data():
    from rlvr_lightning.data import RLVRDataModule, SortTask
    from rlvr_lightning.modules import RLVRModule

    pl.seed_everything(0)
    module = RLVRModule(
        ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=8), group_size=4, kl=KLConfig(coef=0.1)
    )
    return module, RLVRDataModule(task=SortTask(vocab_size=5, length=3, num_val=4), batch_size=4, val_batch_size=2)


def _trainer(reward, **options) -> pl.Trainer:
    return pl.Trainer(
        strategy=FSDP2Strategy(),
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[reward],
        **options,
    )


def test_validating_before_the_first_step_in_inference_mode_then_training(one_process_group):
    """`rlvr validate` on GPUs evaluates under `torch.inference_mode`: FSDP2's first unshard there made inference
    tensors of the buffers every later unshard reuses."""
    from rlvr_lightning.rewards import SortInclusionOrderingReward

    module, data = _toy_module_and_data()
    trainer = _trainer(SortInclusionOrderingReward(), limit_train_batches=2, limit_val_batches=1)
    with evaluation_as_on_gpus():
        (metrics,) = trainer.validate(module, datamodule=data)
        trainer.fit(module, datamodule=data)
    assert "val/reward_mean" in metrics and trainer.global_step == 2


def test_predict_gathers_the_sharded_policy(hf_policy, one_process_group):
    """Sampling decodes under `torch.inference_mode`; without `gathered_params` around it, FSDP2's first unshard
    happened there (and ranks decoding different numbers of tokens would pair their all-gathers wrongly)."""
    from rlvr_lightning.data import RLVRDataModule
    from rlvr_lightning.data.inline_task import InlineTask
    from rlvr_lightning.generation.sampling_config import SamplingConfig
    from rlvr_lightning.modules import RLVRModule

    module = RLVRModule(
        hf_policy(), group_size=2, sampling=SamplingConfig(max_new_tokens=4), validation=ValidationConfig(greedy=False)
    )
    task = InlineTask(examples=[{"prompt": p} for p in PROMPTS], val_examples=[{"prompt": p} for p in PROMPTS[:3]])
    trainer = _trainer(EvenTokenReward())
    rows = [
        row
        for batch in trainer.predict(module, datamodule=RLVRDataModule(task=task, val_batch_size=2))
        for row in batch
    ]
    assert len(rows) == 3 and all(isinstance(row["completion"], str) for row in rows)


@pytest.mark.parametrize("value_model", ["shared", "separate"])
def test_ppo_shards_its_critic_and_reads_hidden_states_through_the_sharded_model(
    hf_policy, one_process_group, value_model
):
    """The value head reads `response_hidden_states`, which ran the decoder alone: outside the model's forward,
    where FSDP2 gathers the embeddings (a sharded DTensor met a plain tensor)."""
    from rlvr_lightning.data import RLVRDataModule
    from rlvr_lightning.data.inline_task import InlineTask
    from rlvr_lightning.generation.sampling_config import SamplingConfig
    from rlvr_lightning.modules import PPOModule

    pl.seed_everything(0)
    module = PPOModule(
        hf_policy(), group_size=2, sampling=SamplingConfig(max_new_tokens=4), value=ValueConfig(model=value_model)
    )
    task = InlineTask(examples=[{"prompt": p} for p in PROMPTS])
    trainer = _trainer(EvenTokenReward(), limit_train_batches=1, limit_val_batches=0)
    trainer.fit(module, datamodule=RLVRDataModule(task=task, batch_size=2))
    assert trainer.global_step == 1
    assert all(type(p).__name__ == "DTensor" for p in module.parameters())  # policy, critic, value head

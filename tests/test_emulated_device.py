"""Training on a device other than the CPU, checked on a CPU (`tests/emulated_device.py`): every recipe, a language
model's step with a KL reference and packed micro-batches (and a distillation teacher), and sampling through our
loop and static decoding build each tensor they combine with the model's on the model's device, as a GPU requires;
the emulation computes what the CPU computes and finds a tensor left on the CPU."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlvr_lightning.cli.app import main
from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config
from tests.emulated_device import DEVICE, OnDevice, emulated_device, move_onto_emulated_device
from tests.test_recipes import RECIPES

ONE_STEP = [
    "--trainer.limit_train_batches=1",
    "--trainer.val_check_interval=1",
    "--trainer.limit_val_batches=1",
    "--trainer.logger=false",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_checkpointing=false",
    "--trainer.enable_model_summary=false",
    "--trainer.callbacks+=tests.emulated_device.OntoEmulatedDevice",
]


def _step(model, ids):
    model.zero_grad()
    logits = model(input_ids=ids).logits
    (logits.float().logsumexp(-1).mean()).backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    return logits


def test_the_emulation_computes_as_the_cpu_and_finds_a_tensor_left_there():
    torch.manual_seed(0)
    config = AutoConfig.for_model(**tiny_llama_config(vocab_size=64))
    cpu, elsewhere = AutoModelForCausalLM.from_config(config), AutoModelForCausalLM.from_config(config)
    elsewhere.load_state_dict(cpu.state_dict())
    ids = torch.randint(0, 64, (2, 7))
    expected = _step(cpu, ids)
    with emulated_device() as device:
        move_onto_emulated_device(elsewhere)
        logits = _step(elsewhere, ids.to(DEVICE))
        assert isinstance(logits, OnDevice) and logits.device == DEVICE
        assert logits.argmax(-1).tolist() == expected.argmax(-1).tolist()  # host reads work
        assert device.mixed == []
        logits + torch.ones(64)  # a tensor left on the CPU
    torch.testing.assert_close(logits.elem, expected, atol=1e-5, rtol=0)
    for mine, theirs in zip(elsewhere.parameters(), cpu.parameters(), strict=True):
        assert isinstance(mine, OnDevice) and isinstance(mine, torch.nn.Parameter)
        torch.testing.assert_close(mine.elem, theirs.detach(), atol=1e-5, rtol=0)
    assert len(device.mixed) == 1 and device.mixed[0].startswith("aten.add.Tensor")


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_a_recipe_trains_on_another_device(recipe, in_tmp_dir):
    with emulated_device() as device:
        cli = main(["fit", "--config", str(recipe), *ONE_STEP])
    assert cli.trainer.global_step > 0 and cli.model.last_rollout.response_ids.device == DEVICE
    assert device.mixed == []


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> str:
    return str(save_tiny_tokenizer(tmp_path_factory.mktemp("tokenizer")))


@pytest.mark.parametrize("backend", ["eager", "static"])
def test_sampling_on_another_device(tokenizer_dir, backend):
    """Our loop and static decoding (the CUDA default; here its step runs eagerly), stop strings and
    `min_new_tokens` included: the CPU's texts, and no tensor left on the CPU."""
    from rlvr_lightning.generation import KVCacheGeneration, StaticCacheGeneration
    from rlvr_lightning.generation.sampling_config import SamplingConfig
    from rlvr_lightning.policies.hf import HFPolicy
    from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions, PromptOptions
    from rlvr_lightning.runtime.devices import set_compute_device

    sampling = SamplingConfig(max_new_tokens=12, stop_strings=["e"], temperature=0.9, min_new_tokens=2)
    prompts = {"prompt": ["What is 2+3?", "The quick brown fox", "Say ab."]}
    texts = []
    for elsewhere in (False, True):
        torch.manual_seed(0)
        generation = GenerationOptions(
            backend=KVCacheGeneration() if backend == "eager" else StaticCacheGeneration(compile="none", sync_every=3)
        )
        policy = HFPolicy(
            model=HFModelOptions(config=tiny_llama_config(), tokenizer=tokenizer_dir),
            generation=generation,
            prompt=PromptOptions(template="raw"),
        )
        with emulated_device() as device:
            if elsewhere:
                move_onto_emulated_device(policy.model)
                set_compute_device(policy, DEVICE)
            torch.manual_seed(1)
            out = policy.sample(prompts, 3, sampling)
        assert out.response_ids.device.type == ("meta" if elsewhere else "cpu") and device.mixed == []
        texts.append(out.response_text)
    assert texts[0] == texts[1]


@pytest.mark.parametrize("packed_attention, teacher", [("model", False), ("flex", False), ("model", True)])
def test_a_language_model_trains_on_another_device(tokenizer_dir, in_tmp_dir, packed_attention, teacher):
    """With a KL reference and packed micro-batches; with a distillation teacher (held outside the module tree)."""
    import lightning.pytorch as pl

    from rlvr_lightning.data import RLVRDataModule
    from rlvr_lightning.data.inline_task import InlineTask
    from rlvr_lightning.generation.sampling_config import SamplingConfig
    from rlvr_lightning.modules import RLVRModule
    from rlvr_lightning.modules.options import KLConfig, UpdateConfig
    from rlvr_lightning.policies.hf import HFPolicy
    from rlvr_lightning.policies.hf_options import HFModelOptions
    from rlvr_lightning.rewards import ContainsReward
    from tests.emulated_device import OntoEmulatedDevice

    pl.seed_everything(0)
    options = HFModelOptions(config=tiny_llama_config(), tokenizer=tokenizer_dir, packed_attention=packed_attention)
    module = RLVRModule(
        HFPolicy(model=options),
        group_size=2,
        sampling=SamplingConfig(max_new_tokens=6),
        update=UpdateConfig(micro_batch_tokens=64),
        kl=KLConfig(coef=0.1, estimator="k3"),
        teacher=HFPolicy(model=options) if teacher else None,
    )
    examples = [{"prompt": "What is 2+3?", "answer": "5"}, {"prompt": "The quick brown", "answer": "fox"}]
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=1,
        limit_train_batches=2,
        limit_val_batches=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ContainsReward(key="answer"), OntoEmulatedDevice()],
    )
    data = RLVRDataModule(task=InlineTask(examples=examples, val_examples=examples), batch_size=2)
    with emulated_device() as device:
        trainer.fit(module, data)
    assert trainer.global_step > 0 and module.last_rollout.response_ids.device == DEVICE
    assert device.mixed == []

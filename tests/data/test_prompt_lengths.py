"""A prompt longer than the model's context fails when the run starts, naming its file and line."""

from __future__ import annotations

import json

import lightning.pytorch as pl
import pytest
import torch

from rlvr_lightning.data import RLVRDataModule
from rlvr_lightning.data.jsonl_task import JSONLTask
from rlvr_lightning.data.prompt_lengths import check_prompt_lengths
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.policies.hf_options import HFModelOptions
from rlvr_lightning.rewards.format import BoxedFormatReward

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config
    from rlvr_lightning.policies.hf import HFPolicy

    tokenizer = save_tiny_tokenizer(tmp_path_factory.mktemp("tok"))
    torch.manual_seed(0)
    return HFPolicy(
        model=HFModelOptions(config=tiny_llama_config(max_position_embeddings=256), tokenizer=str(tokenizer))
    )


def write(path, questions):
    path.write_text("".join(json.dumps({"question": q, "answer": "#### 1"}) + "\n" for q in questions))
    return str(path)


class NeverSamples(RLVRModule):
    def training_step(self, batch, batch_idx):
        raise AssertionError("a batch was built before the prompt lengths were checked")


def test_too_long_prompt_fails_at_start_naming_file_and_line(tmp_path, policy):
    # 256-token context, 32 new tokens: 224 prompt tokens fit. Line 3 is ~300 tokens, line 5 ~100.
    questions = ["What is 2+3?", "The quick brown fox.", "ab " * 300, "What is 1+1?", "x " * 100]
    path = write(tmp_path / "train.jsonl", questions)
    module = NeverSamples(policy, group_size=2, sampling=SamplingConfig(max_new_tokens=32))
    trainer = pl.Trainer(
        max_epochs=1,
        limit_train_batches=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[BoxedFormatReward()],
    )
    data = RLVRDataModule(JSONLTask(path, template="question"), batch_size=2)
    with pytest.raises(
        ValueError,
        match=r"train\.jsonl:3: the prompt is \d+ tokens long; the model's context is 256 tokens "
        r"and sampling.max_new_tokens=32 leaves room for 224",
    ):
        trainer.fit(module, data)


def test_only_prompts_that_might_not_fit_are_tokenised(tmp_path, policy):
    questions = ["What is 2+3?"] * 50 + ["x " * 100]  # 200 bytes: might not fit 224 - 16 tokens, does fit
    task = JSONLTask(write(tmp_path / "t.jsonl", questions), template="question", num_val=5)
    module = RLVRModule(policy, group_size=2, sampling=SamplingConfig(max_new_tokens=32))
    assert check_prompt_lengths(task, module) == 1
    module.sampling = SamplingConfig(max_new_tokens=200)  # now 56 tokens fit: the long one is over
    with pytest.raises(ValueError, match=r"t\.jsonl:51: the prompt is"):
        check_prompt_lengths(task, module)


def test_datasets_task_names_split_and_index(policy):
    datasets = pytest.importorskip("datasets")
    from rlvr_lightning.data.hf_datasets import HFDatasetTask

    task = HFDatasetTask("openai/gsm8k", config_name="main", val_split=None)
    records = [{"question": q, "answer": "#### 1"} for q in ["What is 2+3?", "ab " * 300]]
    task._cache["train"] = task.to_examples(datasets.Dataset.from_list(records))  # in memory, nothing downloaded
    module = RLVRModule(policy, group_size=2, sampling=SamplingConfig(max_new_tokens=32))
    with pytest.raises(ValueError, match=r"openai/gsm8k:train\[1\]: the prompt is"):
        check_prompt_lengths(task, module)

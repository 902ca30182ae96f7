from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))

from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config
from rlvr_lightning.policies.hf_options import HFModelOptions


@pytest.fixture(autouse=True)
def _one_thread():
    # 2 shared cores: OpenMP spin-waiting makes 2-thread torch ~100x slower under contention
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    return save_tiny_tokenizer(tmp_path_factory.mktemp("tiny_tokenizer"))


@pytest.fixture
def make_policy(tokenizer_dir):
    from rlvr_lightning.policies.hf import HFPolicy

    def make(seed: int = 0, model: HFModelOptions = HFModelOptions(), **groups) -> HFPolicy:
        """The tiny Llama (unless `model.config` says otherwise) with the tiny tokenizer."""
        torch.manual_seed(seed)
        config, tokenizer = model.config or tiny_llama_config(), model.tokenizer or str(tokenizer_dir)
        return HFPolicy(model=dataclasses.replace(model, config=config, tokenizer=tokenizer), **groups)

    return make


@pytest.fixture(scope="session")
def tool_tokenizer_dir(tmp_path_factory) -> Path:
    """The tiny tokenizer with `<calculator>`, `<result>`, `<think>` and their closing tags as added tokens."""
    from scripted_lm import save_tool_tokenizer

    return save_tool_tokenizer(tmp_path_factory.mktemp("tool_tokenizer"))


@pytest.fixture(scope="session")
def tool_tokenizer(tool_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tool_tokenizer_dir))


@pytest.fixture
def servers():
    """Two stand-ins for `rlvr serve` (tests/policies/fake_rollout_server.py), stopped after the test."""
    from fake_rollout_server import FakeRolloutServer

    started = [FakeRolloutServer(), FakeRolloutServer()]
    yield started
    for server in started:
        server.stop()

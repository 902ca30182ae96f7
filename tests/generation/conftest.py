from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config  # noqa: F401


@pytest.fixture(autouse=True)
def _one_thread():
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

    def make(seed: int = 0, config: dict | None = None, **kwargs) -> HFPolicy:
        torch.manual_seed(seed)
        kwargs.setdefault("tokenizer_name_or_path", str(tokenizer_dir))
        return HFPolicy(config=config or tiny_llama_config(), **kwargs)

    return make


@pytest.fixture(scope="session")
def tool_tokenizer_dir(tmp_path_factory) -> Path:
    """The tiny tokenizer with `<think>`, `</think>` and the tool tags as added tokens."""
    from scripted_lm import save_tool_tokenizer

    return save_tool_tokenizer(tmp_path_factory.mktemp("tool_tokenizer"))


@pytest.fixture
def eager_without_compaction(monkeypatch):
    """`KVCacheGeneration` keeps finished rows in the batch (`generate(compact=False)`), the random stream static
    decoding reproduces."""
    import functools

    from rlvr_lightning.generation import loop

    monkeypatch.setattr(loop, "generate", functools.partial(loop.generate, compact=False))

"""vLLM engine tests: they run where vLLM is installed (CI builds a second environment with the CPU build
for them: `scripts/vllm_cpu_env.sh`) and are skipped, with the command to run them, everywhere else."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
sys.path.insert(0, str(Path(__file__).parents[1] / "policies"))

from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config
from rlvr_lightning.policies.hf_options import HFModelOptions, PromptOptions

HAS_VLLM = importlib.util.find_spec("vllm") is not None
NO_VLLM = "vLLM is not installed here; run `scripts/vllm_cpu_env.sh` (CPU build in .venv-vllm) to run the engine tests"


def pytest_collection_modifyitems(config, items):
    if HAS_VLLM:
        return
    for item in items:
        if str(Path(__file__).parent) in str(item.fspath):
            item.add_marker(pytest.mark.skip(reason=NO_VLLM))


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    return save_tiny_tokenizer(tmp_path_factory.mktemp("tiny_tokenizer"))


def engine_config(**overrides) -> dict:
    """The tiny Llama with a head size vLLM's CPU attention supports (32)."""
    return tiny_llama_config(hidden_size=128, intermediate_size=256, **overrides)


@pytest.fixture
def make_policy(tokenizer_dir):
    from rlvr_lightning.policies.hf import HFPolicy

    def make(seed: int = 0, **kwargs) -> HFPolicy:
        torch.manual_seed(seed)
        model = kwargs.pop("model", HFModelOptions())
        model = dataclasses.replace(
            model, config=model.config or engine_config(), tokenizer=model.tokenizer or str(tokenizer_dir)
        )
        kwargs.setdefault("prompt", PromptOptions(template="raw"))
        return HFPolicy(model=model, **kwargs)

    return make

"""The update's forwards after an optimizer step read the new weights under CUDA bf16 autocast, where autocast's
cache of weight casts always applies (the CPU version and the detector: tests/modules/test_autocast_updates.py).
The second test is the same run with `torch.clear_autocast_cache` made a no-op, i.e. the update without its
clearing after each optimizer step: the detector must flag it stale, so the first test can fail."""

from __future__ import annotations

import pytest
import torch

from tests.modules.autocast_detector import autocast_cache_never_cleared
from tests.modules.test_autocast_updates import run_path

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (scripts/gpu_check.sh)")

PATHS = ["plain", "lean", "packed", "lora", "critic"]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer

    return save_tiny_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.mark.parametrize("path", PATHS)
def test_cuda_forwards_after_an_optimizer_step_read_the_new_weights(path, tokenizer_dir, monkeypatch):
    recorder = run_path(path, tokenizer_dir, monkeypatch, device="cuda")
    assert recorder.moved_calls()
    assert recorder.stale_calls() == []


@pytest.mark.parametrize("path", PATHS)
def test_cuda_update_without_clearing_the_cache_is_stale(path, tokenizer_dir, monkeypatch):
    with autocast_cache_never_cleared():
        recorder = run_path(path, tokenizer_dir, monkeypatch, device="cuda")
    stale = recorder.stale_calls()
    assert stale and set(stale) <= set(recorder.moved_calls())

"""The file transport's tensors: written by safetensors also when two names share one tensor (tied embeddings)."""

from __future__ import annotations

import torch
from safetensors.torch import load_file, save_file

from rlvr_lightning.serving.weight_broadcast import file_tensors


def test_tied_weights_are_written_once_each(tmp_path):
    embedding = torch.randn(5, 3)
    weights = [("model.embed_tokens.weight", embedding), ("lm_head.weight", embedding), ("norm", torch.ones(3))]
    tensors = file_tensors(weights)
    save_file(tensors, tmp_path / "w.safetensors")  # safetensors refuses tensors that share memory
    loaded = load_file(tmp_path / "w.safetensors")
    assert sorted(loaded) == sorted(name for name, _ in weights)
    assert torch.equal(loaded["lm_head.weight"], embedding) and torch.equal(
        loaded["model.embed_tokens.weight"], embedding
    )
    assert tensors["norm"].data_ptr() == weights[2][1].data_ptr()  # nothing else is copied

"""cuDNN's fused attention is kept out of training on a GPU.

Since torch 2.11, `scaled_dot_product_attention` on H100/H200 runs cuDNN's fused kernel first when a mask is
passed, and its backward returns NaN query gradients when the sequence length is 64 more than a multiple of 128
and a query row's log-sum-exp is below -88.7 (pytorch#196678, trl#7181). A query row that attends to nothing has
a log-sum-exp of -inf, and every left-padded batch has such rows at its padding: the forward and the loss stay
finite, the gradient does not, and the update is skipped (as both updates of one step in four were in an H100
run of the GSM8K recipe at SmolLM2's shape, torch 2.11). The memory-efficient, flash and math kernels are
not affected, so fit turns cuDNN's off for its duration (`PolicyModule.on_fit_start`) and turns it back on at
teardown; `RLVR_CUDNN_ATTENTION=1` keeps it (a torch whose cuDNN kernel is fixed).
"""

from __future__ import annotations

import os

import torch

KEEP_VARIABLE = "RLVR_CUDNN_ATTENTION"


def turn_off_cudnn_attention(device: torch.device) -> bool | None:
    """On a CUDA `device`, turn cuDNN's attention kernel off for `scaled_dot_product_attention` and return whether
    it was on (for `restore_cudnn_attention`); None where nothing changed (another device, or
    `RLVR_CUDNN_ATTENTION=1`)."""
    if device.type != "cuda" or os.environ.get(KEEP_VARIABLE) == "1":
        return None
    was_on = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    return was_on


def restore_cudnn_attention(was_on: bool | None) -> None:
    """Undo `turn_off_cudnn_attention` (given what it returned)."""
    if was_on is not None:
        torch.backends.cuda.enable_cudnn_sdp(was_on)

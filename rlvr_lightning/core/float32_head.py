"""An output layer (LM head) whose logits come from a float32 GEMM of float32 hidden states and a float32 weight,
whatever autocast or the weights' dtype say: the rest of the model may run in bf16 (MiniMax-M1, arXiv:2506.13585,
sec. 3.1: the LM head's precision caused the training/inference probability mismatch; ScaleRL, arXiv:2510.13786:
"FP32 precision at the LM head")."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def float32_linear(hidden: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """`F.linear(hidden, weight, bias)` computed in float32 (the operands upcast, autocast off): float32 logits."""
    with torch.autocast(hidden.device.type, enabled=False):
        return F.linear(hidden.float(), weight.float(), None if bias is None else bias.float())


class Float32Head(nn.Linear):
    """`nn.Linear` whose forward is `float32_linear`: the same parameters (whatever their dtype), float32 logits.

    `use_float32_head` turns a model's plain linear output layer into one in place; a copy of the model (the
    reference, the sampling copy) keeps it, and `generation/sampling_precision.py` keeps its weight float32 in a
    bf16 copy."""

    def forward(self, hidden: Tensor) -> Tensor:
        return float32_linear(hidden, self.weight, self.bias)


def use_float32_head(head: nn.Linear, tied: bool) -> Float32Head:
    """`head` (a plain `nn.Linear`) as a `Float32Head`, in place: the module keeps its parameters, hooks and place
    in the model. Untied, its parameters are stored in float32 (the optimizer then steps them in fp32, as TRL's
    `cast_lm_head_to_fp32`); `tied` (the weight is the input embeddings'), the shared weight keeps its dtype and is
    upcast for the GEMM."""
    if type(head) is not nn.Linear:
        raise TypeError(f"a float32 output layer replaces a plain nn.Linear, not a {type(head).__name__}")
    if not tied:
        head.float()
    head.__class__ = Float32Head  # only the forward differs: state dict, tying and hooks stay as they are
    return head

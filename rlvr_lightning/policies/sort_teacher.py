"""`SortTeacher`: a scripted teacher for the sort task, to distil from without training one first.

At response position t it puts probability `confidence` on the t-th smallest prompt token and spreads the
rest evenly over the other tokens: every token has a finite log-prob (the reverse KL to the teacher stays
finite) and greedy decoding sorts exactly. It has no weights; it scores and samples as `ToySortPolicy`
does (same vocabulary, prompt and response lengths), from fixed logits instead of a network.

Use it as `RLVRModule`'s `teacher` (configs/recipes/distill.yaml); a trained teacher is a checkpoint
loaded with `rlvr_lightning.modules.policy_checkpoint.policy_from_checkpoint`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rlvr_lightning.policies.base import Policy
from rlvr_lightning.policies.toy_sort import ToySortPolicy


class SortTeacher(ToySortPolicy):
    def __init__(self, vocab_size: int = 10, prompt_length: int = 4, confidence: float = 0.9) -> None:
        """`confidence`: the probability of the sorted token at each position, in (1 / vocab_size, 1)."""
        Policy.__init__(self)  # none of ToySortPolicy's weights: the logits are fixed
        if not 1.0 / vocab_size < confidence < 1.0:
            raise ValueError(
                f"SortTeacher: confidence must be in (1/vocab_size, 1) = (1/{vocab_size}, 1), got {confidence}"
            )
        self.vocab_size, self.prompt_length, self.response_length = vocab_size, prompt_length, prompt_length
        self.eos_token = None
        self.confidence = confidence

    def forward(self, prompt_ids: Tensor, with_hidden: bool = False) -> Tensor | tuple[Tensor, None]:
        """Log-probs `[B, response_length, V]`: `log confidence` on the sorted prompt's tokens."""
        other = math.log((1.0 - self.confidence) / (self.vocab_size - 1))
        logits = torch.full((*prompt_ids.shape, self.vocab_size), other, device=prompt_ids.device)
        logits.scatter_(-1, prompt_ids.sort(dim=-1).values.unsqueeze(-1), math.log(self.confidence))
        return (logits, None) if with_hidden else logits

"""The KL reference of a LoRA policy, held in the policy's own model.

A LoRA policy's reference needs no second copy of the model: `AdapterReference` (no weights) stands
for the base model with the adapter disabled, and after `update_reference` for a frozen copy of the
trained adapter (`"default"`) in a second adapter, `"reference"`, that scores the reference log-probs.
A reference made over an adapter that already adds something (loaded trained: a warm-up's, an SFT stage's)
starts as such a copy, since the model with the adapter disabled would be the model before that stage. Which of
the two it is travels in checkpoints (the marker's buffer), and a state dict that holds the reference
adapter's weights adds the adapter before it loads (`add_reference_adapter`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

REFERENCE_ADAPTER = "reference"


class AdapterReference(nn.Module):
    """The KL reference of a LoRA policy: its own base model, adapter disabled (holds no weights)."""

    def __init__(self) -> None:
        super().__init__()
        # set once the adapter is copied into "reference"; a buffer, so that checkpoints keep it with the weights
        self.register_buffer("adapter_copied", torch.zeros((), dtype=torch.uint8))

    @property
    def has_adapter_copy(self) -> bool:
        return bool(self.adapter_copied)

    @has_adapter_copy.setter
    def has_adapter_copy(self, value: bool) -> None:
        self.adapter_copied.fill_(bool(value))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing, unexpected, errors) -> None:
        # a checkpoint from before the marker kept its state: the fresh-adapter reference (such a run could not
        # resume after a refresh)
        state_dict.setdefault(prefix + "adapter_copied", torch.zeros((), dtype=torch.uint8))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing, unexpected, errors)

    def extra_repr(self) -> str:
        return "base model with the adapter disabled" if not self.has_adapter_copy else "reference adapter"


@torch.no_grad()
def copy_adapter_to_reference(peft_model: Any, lora_config: Any, reference: AdapterReference, alpha: float) -> None:
    """Reset the reference to the current policy: the trained adapter copied into the frozen "reference" one."""
    if alpha != 1.0:
        raise NotImplementedError(
            "With LoRA the reference is an adapter; a partial update (alpha < 1) of a low-rank product "
            "is not a low-rank product. Use alpha=1 (reset the reference to the current policy)."
        )
    add_reference_adapter(peft_model, lora_config)
    params = dict(peft_model.named_parameters())
    for name, param in params.items():
        if f".{REFERENCE_ADAPTER}." in name:
            source = params[name.replace(f".{REFERENCE_ADAPTER}.", ".default.")]
            param.copy_(source.detach())
            param.requires_grad_(False)
    reference.has_adapter_copy = True


@contextmanager
def scoring_as_reference(peft_model: Any, reference: AdapterReference) -> Iterator[None]:
    """Inside the block the model (in eval mode) is the reference; afterwards the trained policy again."""
    was_training = peft_model.training
    peft_model.eval()
    try:
        if reference.has_adapter_copy:
            peft_model.set_adapter(REFERENCE_ADAPTER)
            try:
                yield
            finally:
                peft_model.set_adapter("default")  # also makes "default" the trainable one again
                freeze_reference_adapter(peft_model)
        else:
            with peft_model.disable_adapter():
                yield
    finally:
        peft_model.train(was_training)


def add_reference_adapter(peft_model: Any, lora_config: Any) -> None:
    """The frozen "reference" adapter beside the trained one (nothing when it is there)."""
    if REFERENCE_ADAPTER not in peft_model.peft_config:
        peft_model.add_adapter(REFERENCE_ADAPTER, copy.deepcopy(lora_config))
        freeze_reference_adapter(peft_model)


def holds_reference_adapter(state_dict: dict[str, Any], prefix: str = "") -> bool:
    return any(key.startswith(prefix) and f".{REFERENCE_ADAPTER}." in key for key in state_dict)


def fresh_adapter(model: nn.Module) -> bool:
    """Whether a LoRA model's trained adapter adds nothing yet (PEFT starts every lora_B at 0): disabled, it is the
    model itself."""
    return not any(bool(p.any()) for name, p in model.named_parameters() if "lora_B.default" in name)


def freeze_reference_adapter(peft_model: Any) -> None:
    for name, param in peft_model.named_parameters():
        if f".{REFERENCE_ADAPTER}." in name:
            param.requires_grad_(False)


def merged_copy(peft_model: Any) -> nn.Module:
    """A copy of the model with the trained adapter merged into the base weights (the reference adapter dropped)."""
    model = copy.deepcopy(peft_model)
    if REFERENCE_ADAPTER in model.peft_config:
        model.delete_adapter(REFERENCE_ADAPTER)
    return model.merge_and_unload()

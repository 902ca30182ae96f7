"""BAPO in the update: its bounds are searched over the whole mini-batch, so splitting it into micro-batches trains
as one batch does, and the step logs the bounds it found."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.core import BAPO
from rlvr_lightning.modules.options import UpdateConfig
from tests.modules.test_m2po_update import trained


def test_micro_batches_train_as_the_whole_mini_batch():
    loss = BAPO(target=0.5)  # a share the search must raise the bounds for
    split, steps = trained(loss, UpdateConfig(epochs=2, mini_batch_size=8, micro_batch_size=2))
    whole, whole_steps = trained(loss, UpdateConfig(epochs=2, mini_batch_size=8))
    assert torch.allclose(split, whole, atol=1e-6)
    for step, other in zip(steps, whole_steps, strict=True):
        assert step["train/bapo_clip_high"] == pytest.approx(other["train/bapo_clip_high"], rel=1e-6)
        assert step["train/bapo_clip_low"] == pytest.approx(other["train/bapo_clip_low"], rel=1e-6)
        assert 1.2 < step["train/bapo_clip_high"] < 3.0  # a mean over the step's mini-batches
        assert 0.6 < step["train/bapo_clip_low"] < 0.9
    assert all(0.0 <= step["train/bapo_positive_share"] <= 1.0 for step in steps)


def test_a_search_per_micro_batch_would_train_otherwise():
    """What the test above rules out: each micro-batch searching its own bounds (the authors' verl recipe)."""
    loss = BAPO(target=0.5)
    split, _ = trained(loss, UpdateConfig(epochs=2, mini_batch_size=8, micro_batch_size=2))
    loss.selects_tokens = False  # instance attribute: the update then lets each micro-batch search alone
    alone, _ = trained(loss, UpdateConfig(epochs=2, mini_batch_size=8, micro_batch_size=2))
    assert not torch.allclose(split, alone, atol=1e-6)

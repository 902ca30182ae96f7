"""`ContainsReward`."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.rewards.text import ContainsReward
from rlvr_lightning.rollout import Rollout


def rollout(texts, metadata):
    return Rollout.from_texts(texts, metadata=metadata)


def test_fixed_target_and_metadata_key():
    r = rollout(["The answer is 19.", "twenty", "STOP"], [{"answer": "19"}, {"answer": "20"}, {}])
    assert ContainsReward(target="stop", case_sensitive=False)(r).tolist() == [0.0, 0.0, 1.0]
    by_key = ContainsReward(key="answer")
    assert by_key(r).tolist() == [1.0, 0.0, 0.0]
    assert by_key.pop_errors() == 1  # the row without an answer scores 0 and is counted
    assert by_key.is_correct(r, torch.tensor([1.0, 0.0, 0.0])).tolist() == [True, False, False]
    assert by_key.name == "contains"


def test_needs_exactly_one_source():
    with pytest.raises(ValueError, match="exactly one of target"):
        ContainsReward()
    with pytest.raises(ValueError, match="exactly one of target"):
        ContainsReward(target="a", key="answer")

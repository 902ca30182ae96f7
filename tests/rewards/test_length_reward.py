"""LengthReward (Kimi k1.5) and OverlongPenalty (DAPO), hand-computed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlvr_lightning.rewards.format import BoxedFormatReward
from rlvr_lightning.rewards.length import LengthReward, OverlongPenalty, kimi_length_reward
from rlvr_lightning.rewards.math import MathAccuracyReward
from tests.rewards.test_math_reward import make_rollout


def test_kimi_formula_by_hand():
    # groups of 2: (2, 4) -> lambda 0.5, -0.5; (6, 10) -> 0.5, -0.5; (5, 5) -> 0, 0
    lengths = torch.tensor([2, 4, 6, 10, 5, 5])
    correct = torch.tensor([True, False, True, False, True, False])
    out = kimi_length_reward(lengths, correct, group_size=2)
    assert out.tolist() == [0.5, -0.5, 0.5, -0.5, 0.0, 0.0]
    # one group of 4: lengths 2, 4, 6, 10 -> lambda = 0.5 - (len - 2) / 8 = 0.5, 0.25, 0.0, -0.5
    out = kimi_length_reward(lengths[:4], correct[:4], group_size=4)
    assert out.tolist() == [0.5, 0.0, 0.0, -0.5]  # the wrong 4-token answer gets min(0, 0.25) = 0
    assert kimi_length_reward(lengths[4:], correct[4:], group_size=2).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="whole groups"):
        kimi_length_reward(lengths[:3], correct[:3], group_size=2)


def test_length_reward_reads_correctness_from_the_named_reward():
    rollout = make_rollout(["a", "b", "c", "d"], group_size=4, lengths=[2, 4, 6, 10])
    rollout.rewards["math_accuracy"] = torch.tensor([1.0, 0.0, 1.0, 0.0])
    reward = LengthReward(correct_reward="math_accuracy")
    assert reward.kind == "shaping" and reward.name == "length"
    assert reward(rollout).tolist() == [0.5, 0.0, 0.0, -0.5]
    # nothing reaches the threshold: everyone is wrong, only the penalties remain
    assert LengthReward(correct_reward="math_accuracy", correct_threshold=2.0)(rollout).tolist() == [
        0.0,
        0.0,
        0.0,
        -0.5,
    ]


def test_length_reward_without_its_correctness_signal_is_a_configuration_error():
    rollout = make_rollout(["a", "b"], group_size=2)
    with pytest.raises(ValueError, match="list that reward before LengthReward"):
        LengthReward(correct_reward="math_accuracy")(rollout)  # raises although on_error="zero"


def test_length_reward_picks_the_first_task_reward_listed_before_it():
    accuracy, fmt, length = MathAccuracyReward(), BoxedFormatReward(), LengthReward()
    length.setup(SimpleNamespace(callbacks=[fmt, accuracy, length]), None, "fit")
    assert length._resolved == "math_accuracy"
    late = LengthReward()
    with pytest.raises(ValueError, match="no kind='task' reward before it"):
        late.setup(SimpleNamespace(callbacks=[fmt, late, accuracy]), None, "fit")


@pytest.mark.parametrize("penalty", [1.0, 0.5])
def test_overlong_penalty_by_hand(penalty):
    # max_len 10, buffer 4: free up to 6 tokens, then -1/4 per token, -1 at 10 and beyond
    reward = OverlongPenalty(max_len=10, buffer=4, penalty=penalty)
    lengths = [1, 6, 7, 8, 10, 12]
    rollout = make_rollout(["x"] * 6, lengths=lengths)
    expected = [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    assert reward(rollout).tolist() == pytest.approx([penalty * e for e in expected])
    assert reward.kind == "shaping" and reward.name == "overlong_penalty"


def test_overlong_penalty_arguments():
    with pytest.raises(ValueError, match="buffer"):
        OverlongPenalty(max_len=10, buffer=0)
    with pytest.raises(ValueError, match="buffer"):
        OverlongPenalty(max_len=10, buffer=11)
    assert OverlongPenalty(max_len=4, buffer=4)(make_rollout(["x"] * 3, lengths=[1, 2, 4])).tolist() == [
        -0.25,
        -0.5,
        -1.0,
    ]


def test_lengths_count_inserted_tokens_of_multi_turn_responses():
    """A tool observation (mask 0) inside a response counts in its length, as the token budget does."""
    from rlvr_lightning.rollout import TokenSource

    rollout = make_rollout(["a", "b"], group_size=2, lengths=[6, 6])
    S, T = TokenSource.SAMPLED, TokenSource.TOOL
    rollout.response_source = torch.tensor([[S, S, T, T, T, S], [S, S, S, S, S, S]])
    rollout.response_mask = (rollout.response_source == S).float()  # 3 and 6 sampled tokens
    assert OverlongPenalty(max_len=6, buffer=4)(rollout).tolist() == [-1.0, -1.0]  # both 6 long, not 3 and 6
    rollout.rewards["math_accuracy"] = torch.tensor([1.0, 1.0])
    assert LengthReward(correct_reward="math_accuracy")(rollout).tolist() == [0.0, 0.0]  # equal lengths

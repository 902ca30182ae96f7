"""ModelReward, the base of model-judged rewards: batching, per-row failures, the time budget, placement."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from rlvr_lightning.rewards import model_reward
from rlvr_lightning.rewards.model_reward import ModelReward
from tests.rewards.test_math_reward import make_rollout


class LengthScorer(ModelReward):
    """Scores a response by its length; a chunk holding "poison" raises, a response "bad" is an unscorable row."""

    def __init__(self, clock=None, **kwargs):
        super().__init__(**kwargs)
        self.model = nn.Linear(2, 1)
        self.calls: list[list[int]] = []
        self.clock = clock

    @property
    def scorer(self):
        return self.model

    def score_rows(self, rollout, rows):
        self.calls.append(list(rows))
        if self.clock is not None:
            self.clock.now += 1.0  # every call takes one second
        texts = [rollout.response_text[i] for i in rows]
        if any("poison" in t for t in texts):
            raise RuntimeError("scorer crashed")
        return [ValueError("unscorable") if t == "bad" else float(len(t)) for t in texts]


TEXTS = ["a", "bb", "ccc", "dddd", "eeeee", "ffffff", "g", "hh", "iii", "jjjj"]


def test_rows_are_scored_in_batches():
    reward = LengthScorer(batch_size=4)
    assert reward(make_rollout(TEXTS)).tolist() == [float(len(t)) for t in TEXTS]
    assert reward.calls == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert reward.pop_errors() == 0


def test_a_failing_chunk_is_retried_row_by_row_and_costs_only_its_bad_rows():
    texts = list(TEXTS)
    texts[5], texts[8] = "poison", "bad"
    reward = LengthScorer(batch_size=4)
    scores = reward(make_rollout(texts))
    expected = [float(len(t)) for t in texts]
    expected[5] = expected[8] = 0.0
    assert scores.tolist() == expected
    assert reward.calls == [[0, 1, 2, 3], [4, 5, 6, 7], [4], [5], [6], [7], [8, 9]]
    assert reward.pop_errors() == 2  # the poisoned row and the unscorable one
    strict = LengthScorer(batch_size=4, on_error="raise")
    with pytest.raises(RuntimeError, match="scorer crashed"):
        strict(make_rollout(texts))
    with pytest.raises(ValueError, match="unscorable"):
        strict(make_rollout(["a", "bad"]))


def test_rows_left_when_the_batch_budget_is_spent_score_zero(monkeypatch):
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(model_reward, "time", types.SimpleNamespace(monotonic=lambda: clock.now))
    reward = LengthScorer(clock=clock, batch_size=3, batch_timeout_s=2.5)
    scores = reward(make_rollout(TEXTS))
    # chunks start at t = 0, 1, 2; at t = 3 the 2.5 s budget is spent: rows 9.. are not scored
    assert reward.calls == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert scores.tolist() == [float(len(t)) for t in TEXTS[:9]] + [0.0]
    assert reward.num_timeouts == 1 and reward.pop_errors() == 1 and reward.num_timeouts == 0
    # the budget is per batch: the next batch starts afresh
    reward.calls.clear()
    reward(make_rollout(TEXTS[:3]))
    assert reward.calls == [[0, 1, 2]] and reward.pop_errors() == 0
    # a chunk that fails is retried row by row only while the budget lasts
    texts = ["poison", "a", "b", "c"]
    clock.now = 0.0
    reward = LengthScorer(clock=clock, batch_size=4, batch_timeout_s=2.5)
    assert reward(make_rollout(texts)).tolist() == [0.0, 1.0, 0.0, 0.0]
    assert reward.calls == [[0, 1, 2, 3], [0], [1]] and reward.pop_errors() == 3
    strict = LengthScorer(clock=clock, batch_size=3, batch_timeout_s=0.5, on_error="raise")
    with pytest.raises(TimeoutError, match="rows not scored within batch_timeout_s=0.5"):
        strict(make_rollout(TEXTS))


def test_setup_freezes_the_scorer_on_the_trainer_device_and_refuses_the_policy():
    reward = LengthScorer()
    trainer = types.SimpleNamespace(strategy=types.SimpleNamespace(root_device=torch.device("cpu")))
    reward.setup(trainer, nn.Linear(3, 3), "fit")
    assert not any(p.requires_grad for p in reward.model.parameters())
    module = nn.Module()
    module.policy = reward.model  # the trained module holds the scorer: refused
    with pytest.raises(ValueError, match="shares parameters with the trained module"):
        reward.setup(trainer, module, "fit")


def test_options_and_correctness():
    reward = LengthScorer(correct_threshold=3.0)
    rollout = make_rollout(["ab", "abc", "abcd"])
    assert reward.kind == "task"
    assert reward.is_correct(rollout, reward(rollout)).tolist() == [False, True, True]
    assert LengthScorer().is_correct(rollout, reward(rollout)) is None
    with pytest.raises(ValueError, match="batch_size"):
        LengthScorer(batch_size=0)
    with pytest.raises(ValueError, match="batch_timeout_s"):
        LengthScorer(batch_timeout_s=0)

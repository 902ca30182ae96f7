"""`CosineLengthReward` and `RepetitionPenalty` (Yeo et al. 2025): by hand, against the authors' and TRL's code."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch

from rlvr_lightning.rewards import CosineLengthReward, MathAccuracyReward, RepetitionPenalty
from rlvr_lightning.rewards.length import cosine_length_reward
from rlvr_lightning.rewards.repetition import repetition_penalty
from tests.rewards.test_math_reward import make_rollout

PAPER = (2.0, 1.0, -10.0, 0.0, -10.0)  # correct short/long, wrong short/long, exceed


def authors_cosine(gen_len, correct, max_len, min_value_wrong, max_value_wrong, min_value_correct, max_value_correct):
    """`CosineScaledSparseReward.reward` for one row (eddycmu/demystify-long-cot e90cf9b), restated, without
    its exceed-length branch and repetition term."""
    if correct:
        min_value, max_value = min_value_correct, max_value_correct
    else:
        min_value, max_value = max_value_wrong, min_value_wrong
    return min_value + 0.5 * (max_value - min_value) * (1.0 + math.cos(gen_len / max_len * math.pi))


def trl_repetition(ids, ngram_size, max_penalty):
    """TRL's `_RepetitionPenalty.__call__` for one completion (trl/rewards/other_rewards.py, f2cd577), restated."""
    if len(ids) < ngram_size:
        return 0.0
    ngrams = list(zip(*[ids[i:] for i in range(ngram_size)], strict=False))
    scaling = 1 - len(set(ngrams)) / len(ngrams)
    return scaling * max_penalty if scaling else 0.0


def test_cosine_by_hand():
    lengths = torch.tensor([0.0, 50.0, 100.0, 0.0, 50.0, 100.0, 30.0, 150.0])
    correct = torch.tensor([1, 1, 1, 0, 0, 0, 1, 1]).bool()
    truncated = torch.tensor([0, 0, 0, 0, 0, 0, 1, 0]).bool()
    scores = cosine_length_reward(lengths, correct, truncated, 100, PAPER)
    # correct: 2 at 0 tokens, 1.5 half way, 1 at max_len; wrong: -10, -5, 0; cut off: -10; past max_len: held at 1
    assert scores.tolist() == pytest.approx([2.0, 1.5, 1.0, -10.0, -5.0, 0.0, -10.0, 1.0])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cosine_agrees_with_the_authors(seed):
    rng = random.Random(seed)
    lengths = [rng.randrange(0, 4096) for _ in range(64)]
    correct = [rng.random() < 0.5 for _ in range(64)]
    ours = cosine_length_reward(
        torch.tensor(lengths, dtype=torch.float32),
        torch.tensor(correct),
        torch.zeros(64, dtype=torch.bool),
        4096,
        PAPER,
    )
    theirs = [authors_cosine(n, c, 4096, -10.0, 0.0, 1.0, 2.0) for n, c in zip(lengths, correct, strict=True)]
    assert ours.tolist() == pytest.approx(theirs, abs=1e-5)


def test_cosine_reward_in_a_rollout():
    rollout = make_rollout(["a", "b", "c", "d"], group_size=4, lengths=[2, 4, 4, 8])
    rollout.rewards["math_accuracy"] = torch.tensor([1.0, 1.0, 0.0, 0.0])
    rollout.truncated = torch.tensor([False, False, False, True])
    reward = CosineLengthReward(max_len=8, correct_reward="math_accuracy")
    assert reward.kind == "shaping" and reward.name == "cosine_length"
    short = 1.0 + 0.5 * (1.0 + math.cos(math.pi / 4))  # a correct response a quarter of the way
    assert reward(rollout).tolist() == pytest.approx([short, 1.5, -5.0, -10.0])


def test_cosine_reward_takes_max_len_from_the_run_and_finds_the_task_reward():
    accuracy, cosine = MathAccuracyReward(), CosineLengthReward()
    module = SimpleNamespace(sampling=SimpleNamespace(max_new_tokens=256))
    cosine.setup(SimpleNamespace(callbacks=[accuracy, cosine]), module, "fit")
    assert (cosine.max_len, cosine._resolved) == (256, "math_accuracy")
    with pytest.raises(ValueError, match="list that reward before CosineLengthReward"):
        CosineLengthReward(max_len=8, correct_reward="math_accuracy")(make_rollout(["a"]))
    with pytest.raises(ValueError, match=r"max_len=0 is not valid"):
        CosineLengthReward(max_len=0)


def test_repetition_penalty_by_hand():
    assert repetition_penalty([1, 2, 3, 4], 2, -1.0) == 0.0
    assert repetition_penalty([5, 5, 5, 5, 5], 2, -1.0) == pytest.approx(-0.75)  # 4 bigrams, 1 unique
    assert repetition_penalty([1, 2, 1, 2, 1], 2, -0.5) == pytest.approx(-0.25)  # 4 bigrams, 2 unique
    assert repetition_penalty([1, 2], 3, -1.0) == 0.0  # shorter than n


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_repetition_penalty_agrees_with_trl(seed):
    rng = random.Random(seed)
    for _ in range(50):
        ids = [rng.randrange(4) for _ in range(rng.randrange(0, 30))]
        n = rng.randrange(1, 5)
        assert repetition_penalty(ids, n, -1.0) == pytest.approx(trl_repetition(ids, n, -1.0))


def test_repetition_penalty_reads_real_tokens_or_words():
    rollout = make_rollout(["the cat the cat the cat", "a b c d"], lengths=[5, 3])
    rollout.response_ids = torch.tensor([[7, 7, 7, 7, 7], [1, 2, 3, 9, 9]])  # padding past the real 3 tokens
    tokens = RepetitionPenalty(ngram_size=2)
    assert tokens.kind == "shaping" and tokens.name == "repetition_penalty"
    assert tokens(rollout).tolist() == pytest.approx([-0.75, 0.0])  # row 2's padding 9, 9 is not read
    words = RepetitionPenalty(ngram_size=2, unit="words")
    assert words(rollout).tolist() == pytest.approx([-0.6, 0.0])  # 5 bigrams, 2 unique
    rollout.response_text = None
    with pytest.raises(ValueError, match="needs decoded responses"):
        RepetitionPenalty(unit="words", on_error="raise")(rollout)
    with pytest.raises(ValueError, match=r"max_penalty=0.5 is not valid"):
        RepetitionPenalty(max_penalty=0.5)


def test_the_cosine_reward_replaces_a_task_reward_of_weight_zero():
    """As the paper uses it: the task reward tells correctness (and validation accuracy) but adds nothing itself."""
    from rlvr_lightning.modules.scoring import correctness, score

    rollout = make_rollout([r"\boxed{4}", r"\boxed{5}"], [{"answer": "4"}] * 2, lengths=[2, 6])
    accuracy, cosine = MathAccuracyReward(weight=0.0), CosineLengthReward(max_len=8)
    cosine.setup(SimpleNamespace(callbacks=[accuracy, cosine]), None, "fit")
    score(rollout, [accuracy, cosine])
    assert rollout.rewards["math_accuracy"].tolist() == [1.0, 0.0]
    expected = [1.0 + 0.5 * (1.0 + math.cos(math.pi / 4)), -5.0 * (1.0 + math.cos(3 * math.pi / 4))]
    assert rollout.reward.tolist() == pytest.approx(expected)
    assert correctness(rollout, [accuracy, cosine]).tolist() == [True, False]

"""`ReasoningGymReward` agrees with reasoning-gym's own scorer, and bad scorer output costs its row only."""

from __future__ import annotations

import math
import time

import pytest
import reasoning_gym  # noqa: I001  (after rg_support: skipped without the envs extra)
import torch

from rlvr_lightning.data.reasoning_gym_task import ReasoningGymTask
from rlvr_lightning.rewards.reasoning_gym import ReasoningGymReward
from rlvr_lightning.rollout import Rollout
from tests.envs.rg_support import USED_DATASETS, row_metadata

ENTRIES = 200


def corrupt(answer: str, k: int) -> str:
    """A wrong answer of one of three kinds: changed, truncated, padded."""
    if k % 3 == 0:
        return answer[:-1] + ("0" if answer[-1:] != "0" else "1")
    if k % 3 == 1:
        return answer[: max(len(answer) // 2, 1) - 1] or "x"
    return answer + " and more"


@pytest.mark.parametrize("spec", USED_DATASETS, ids=[spec["name"] for spec in USED_DATASETS])
def test_scores_agree_with_reasoning_gyms_scorer_on_correct_and_corrupted_answers(spec):
    task = ReasoningGymTask(datasets=[spec], num_val=0, seed=11)
    examples = [task.train_example(i) for i in range(ENTRIES)]
    # reasoning-gym's own dataset, built independently from the same config
    own = reasoning_gym.create_dataset(spec["name"], **examples[0]["rg_config"], seed=0, size=1)
    answers = [e["answer"] if k % 2 == 0 else corrupt(e["answer"], k) for k, e in enumerate(examples)]
    texts = [f"Let me think. \\boxed{{{answer}}}" for answer in answers]
    reward = ReasoningGymReward(methods=["boxed"])
    scores = reward(Rollout.from_texts(texts, metadata=[row_metadata(e) for e in examples]))
    expected = [float(own.score_answer(a, e["rg_entry"])) for a, e in zip(answers, examples, strict=True)]
    assert scores.tolist() == pytest.approx(expected)
    assert reward.num_errors == 0
    correct = scores[0::2]
    assert bool((correct == 1.0).all()), "a reference answer scores 1"
    assert float(scores[1::2].max()) < 1.0, "no corrupted answer scores full marks"
    assert reward.is_correct(None, scores).tolist() == [s >= 1.0 for s in scores.tolist()]


def test_extraction_methods_in_order_and_no_answer_scores_zero():
    task = ReasoningGymTask(datasets=[USED_DATASETS[0]], num_val=0)
    example = task.train_example(0)
    answer = example["answer"]
    reward = ReasoningGymReward(methods=["boxed", "answer_tag", "last_number"])
    texts = [f"<answer>{answer}</answer>", f"so it is 99999 then {answer}", "no number here", f"\\boxed{{{answer}}} 7"]
    scores = reward(Rollout.from_texts(texts, metadata=[row_metadata(example)] * 4))
    assert scores.tolist() == [1.0, 1.0, 0.0, 1.0]
    assert reward.extract_answers(Rollout.from_texts(texts))[:3] == [answer, answer, None]
    whole = ReasoningGymReward(methods=["response"])
    assert whole(Rollout.from_texts([f"  {answer}\n"], metadata=[row_metadata(example)])).tolist() == [1.0]


def test_unknown_extraction_method_is_refused():
    with pytest.raises(ValueError, match="unknown extraction method 'boxd'"):
        ReasoningGymReward(methods=["boxd"])


class _Scorer:
    def __init__(self, behaviour):
        self.behaviour = behaviour

    def score_answer(self, answer, entry):
        return self.behaviour(answer)


def _hang(answer):
    time.sleep(3)
    return 1.0


@pytest.mark.parametrize(
    "behaviour, why",
    [
        (lambda a: 1 / 0, "ZeroDivisionError"),
        (lambda a: math.nan, "not a finite number"),
        (_hang, "TimeoutError"),
    ],
    ids=["raises", "nan", "hangs"],
)
def test_a_bad_scorer_costs_its_row_only(behaviour, why, monkeypatch):
    task = ReasoningGymTask(datasets=[USED_DATASETS[0], USED_DATASETS[1]], num_val=0)
    examples = [task.train_example(i) for i in range(8)]
    reward = ReasoningGymReward(methods=["boxed"], timeout_s=0.5)
    good = reward.scorer
    bad_dataset = examples[0]["rg_dataset"]

    def scorer(dataset, config):
        return _Scorer(behaviour) if dataset == bad_dataset else good(dataset, config)

    monkeypatch.setattr(reward, "scorer", scorer)
    texts = [f"\\boxed{{{e['answer']}}}" for e in examples]
    scores = reward(Rollout.from_texts(texts, metadata=[row_metadata(e) for e in examples]))
    bad = torch.tensor([e["rg_dataset"] == bad_dataset for e in examples])
    assert 0 < int(bad.sum()) < len(examples)
    assert scores[bad].tolist() == [0.0] * int(bad.sum())
    assert scores[~bad].tolist() == [1.0] * int((~bad).sum())
    assert reward.num_errors == int(bad.sum())
    assert why in reward._first_error

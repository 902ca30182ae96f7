"""CalibrationReward (RLCR): the stated confidence read from the text, minus its Brier score against the task
reward's verdict, the penalty for stating none, and the calibration metrics of training and validation passes."""

from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace

import pytest
import torch

from rlvr_lightning.rewards.base import RewardCallback
from rlvr_lightning.rewards.calibration import CalibrationReward, parse_confidence, vote_outcomes
from rlvr_lightning.rollout import Rollout


@pytest.mark.parametrize(
    "text, value",
    [
        ("<answer>4</answer><confidence>0.85</confidence>", 0.85),
        ("<confidence> .85 </confidence>", 0.85),
        ("<confidence>85%</confidence>", 0.85),
        ("<confidence>1</confidence>", 1.0),
        ("<confidence>0.2</confidence> on second thought <confidence>0.9</confidence>", 0.9),  # the last counts
        ("<confidence>\n0.4\n</confidence>", 0.4),
        ("<confidence>1.5</confidence>", None),  # outside [0, 1]
        ("<confidence>150%</confidence>", None),
        ("<confidence>high</confidence>", None),
        ("<confidence>__import__('os').system('x')</confidence>", None),  # read, never evaluated
        ("<confidence>1e-3</confidence>", None),
        ("confidence: 0.9", None),
        ("", None),
    ],
)
def test_parse_confidence(text, value):
    assert parse_confidence(text) == (None if value is None else pytest.approx(value))


def _scored(texts, task_scores, **options):
    rollout = Rollout.from_texts(texts)
    rollout.rewards["math_accuracy"] = torch.tensor(task_scores)
    reward = CalibrationReward(correct_reward="math_accuracy", **options)
    return reward, reward(rollout)


def test_score_is_minus_the_brier_score_and_the_total_is_rlcrs_reward():
    texts = [
        "<confidence>0.9</confidence>",  # right, 0.9: -(0.1)^2
        "<confidence>0.9</confidence>",  # wrong, 0.9: -(0.9)^2
        "<confidence>0</confidence>",  # wrong, 0: 0
        "<confidence>0.3</confidence>",  # right, 0.3: -(0.7)^2
        "no confidence",  # -1 however right
        "<confidence>2</confidence>",  # -1: not a confidence
    ]
    task = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    reward, scores = _scored(texts, task)
    assert reward.kind == "shaping" and reward.name == "calibration"
    torch.testing.assert_close(scores, torch.tensor([-0.01, -0.81, 0.0, -0.49, -1.0, -1.0]))
    # with the task reward at weight 1: RLCR's 1[c] - (q - c)^2
    torch.testing.assert_close(torch.tensor(task) + scores, torch.tensor([0.99, -0.81, 0.0, 0.51, 0.0, -1.0]))
    _, lenient = _scored(texts, task, missing_penalty=0.25)
    assert lenient[-2:].tolist() == [-0.25, -0.25]


def test_custom_pattern_and_threshold():
    texts = ["answer 3, sure at 0.8", "answer 4, sure at 0.2"]
    _, scores = _scored(texts, [0.5, 0.4], pattern=r"sure at ([\d.]+)", correct_threshold=0.5)
    torch.testing.assert_close(scores, torch.tensor([-0.04, -0.04]))  # right at 0.8, wrong at 0.2


@pytest.mark.parametrize(
    "options, message",
    [
        ({"pattern": "(unclosed"}, r"pattern='\(unclosed' is not a regular expression"),
        ({"pattern": "<c>.*</c>"}, r"pattern='<c>.\*</c>' has no group"),
        ({"missing_penalty": -1.0}, r"missing_penalty=-1.0 is not valid"),
    ],
)
def test_a_wrong_option_names_itself(options, message):
    with pytest.raises(ValueError, match=message):
        CalibrationReward(**options)


def test_training_metrics_by_hand():
    texts = ["<confidence>0.95</confidence>", "<confidence>0.85</confidence>", "none", "<confidence>0.25</confidence>"]
    reward, _ = _scored(texts, [1.0, 0.0, 1.0, 1.0])
    metrics = reward.pop_metrics()
    # stated: 3 of 4; Brier (0.05^2 + 0.85^2 + 0.75^2) / 3; ECE (0.05 + 0.85 + 0.75) / 3; confidence 2.05 / 3;
    # AUROC over the (right, wrong) pairs (0.95, 0.85) 1 and (0.25, 0.85) 0: 1/2; no groups, no votes
    assert metrics == pytest.approx(
        {"stated": 0.75, "brier": (0.0025 + 0.7225 + 0.5625) / 3, "ece": 1.65 / 3, "confidence": 2.05 / 3, "auroc": 0.5}
    )
    assert reward.pop_metrics() == {}  # counted once


def test_validation_rows_are_logged_as_validation_metrics_not_training_ones():
    logged = {}
    trainer = SimpleNamespace(
        validating=True,
        sanity_checking=False,
        callbacks=[],
        strategy=SimpleNamespace(reduce=lambda tensor, reduce_op: tensor * 2),  # two ranks with the same rows
    )
    module = SimpleNamespace(device=torch.device("cpu"), log_dict=lambda metrics: logged.update(metrics))
    reward = CalibrationReward(correct_reward="math_accuracy")
    reward.setup(trainer, module, "fit")
    rollout = Rollout.from_texts(["<confidence>1</confidence>", "<confidence>0.5</confidence>"])
    rollout.rewards["math_accuracy"] = torch.tensor([1.0, 0.0])
    reward.on_validation_epoch_start(trainer, module)
    reward(rollout)
    reward.on_validation_epoch_end(trainer, module)
    assert logged == pytest.approx(
        {
            "val/rewards/calibration/stated": 1.0,
            "val/rewards/calibration/brier": 0.125,
            "val/rewards/calibration/ece": 0.25,
            "val/rewards/calibration/confidence": 0.75,
            "val/rewards/calibration/auroc": 1.0,
        }
    )
    assert reward.pop_metrics() == {}
    trainer.validating = False
    reward(rollout)
    assert reward.pop_metrics()["brier"] == pytest.approx(0.125)


class _Answers(RewardCallback):
    """A correctness reward's stand-in that reads `<answer>` tags."""

    def __init__(self) -> None:
        super().__init__(name="math_accuracy")

    def score(self, rollout):
        raise AssertionError("not scored here")

    def extract_answers(self, rollout):
        return [m.group(1) if (m := re.search("<answer>(.*?)</answer>", t)) else None for t in rollout.response_text]


@pytest.mark.parametrize(
    "group, solved",
    [
        # vote 5 (two of three, wrong); weighted 4 (0.9 against 0.3 + 0.4); the most confident says 4
        ([("4", 0.9, True), ("5", 0.3, False), ("5", 0.4, False)], [0, 1, 1]),
        # vote 7; weighted 7 (0.6 + 0.6 against 0.9); the most confident says 8
        ([("7", 0.6, True), ("7", 0.6, True), ("8", 0.9, False)], [1, 1, 0]),
        # vote: 9 and 6 tie, the first seen wins; weighted 6 (no stated confidence weighs 0); the most
        # confident response gives no answer; no answer, no vote
        ([("9", None, True), ("6", 0.5, False), (None, 1.0, False)], [1, 0, 0]),
        ([(None, 0.5, False), (None, 0.9, False)], [0, 0, 0]),
    ],
)
def test_vote_outcomes_by_hand(group, solved):
    answers = [a for a, _, _ in group]
    confidence = torch.tensor([float("nan") if q is None else q for _, q, _ in group])
    correct = torch.tensor([ok for _, _, ok in group])
    assert vote_outcomes(answers, confidence, correct, len(group)).tolist() == [1.0, *solved]


def test_votes_are_logged_per_prompt_from_the_correctness_rewards_answers():
    rows = [("4", "0.9", True), ("5", "0.3", False), ("5", "0.4", False)]
    rows += [("7", "0.6", True), ("7", "0.6", True), ("8", "0.9", False)]
    texts = [f"<answer>{a}</answer><confidence>{q}</confidence>" for a, q, _ in rows]
    rollout = dataclasses.replace(Rollout.from_texts(texts), group_size=3, group_index=torch.arange(6) // 3)
    rollout.rewards["math_accuracy"] = torch.tensor([float(ok) for _, _, ok in rows])
    trainer = SimpleNamespace(validating=False, sanity_checking=False, callbacks=[_Answers()])
    reward = CalibrationReward(correct_reward="math_accuracy")
    reward.setup(trainer, None, "fit")
    reward(rollout)
    metrics = reward.pop_metrics()
    assert [metrics["vote"], metrics["vote_weighted"], metrics["vote_max_confidence"]] == [0.5, 1.0, 0.5]
    # in groups of one there is nothing to vote on
    reward(dataclasses.replace(rollout, group_size=1, group_index=torch.arange(6)))
    assert "vote" not in reward.pop_metrics()


def test_votes_need_answers():
    """Without a correctness reward that reads answers, no vote is logged."""
    rollout = dataclasses.replace(Rollout.from_texts(["<confidence>1</confidence>"] * 2), group_size=2)
    rollout.rewards["math_accuracy"] = torch.tensor([1.0, 0.0])
    reward = CalibrationReward(correct_reward="math_accuracy")
    reward.setup(SimpleNamespace(validating=False, sanity_checking=False, callbacks=[]), None, "fit")
    reward(rollout)
    assert set(reward.pop_metrics()) == {"stated", "brier", "ece", "confidence", "auroc"}


def test_the_rlcr_warm_up_data_is_in_the_format_the_rewards_read():
    """configs/data/arithmetic_confidence_warmup.jsonl (scripts/make_arithmetic_warmup.py --confidence): the prompt asks
    for the tags, each response boxes the right sum and states a confidence from 0.1 to 0.9, and the file is the
    script's output."""
    import json
    from pathlib import Path

    from tests.script_modules import load_script

    repo = Path(__file__).resolve().parents[2]
    pairs = load_script("make_arithmetic_warmup").warmup_pairs(confidence=True)
    with open(repo / "configs" / "data" / "arithmetic_confidence_warmup.jsonl", encoding="utf-8") as handle:
        assert [json.loads(line) for line in handle] == pairs
    from rlvr_lightning.grading.answers import extract_boxed

    stated = [parse_confidence(pair["response"]) for pair in pairs]
    assert all("<confidence></confidence>" in pair["prompt"] for pair in pairs)
    assert all(extract_boxed(pair["response"]) == pair["answer"] for pair in pairs)
    assert set(stated) == {round(0.1 * k, 1) for k in range(1, 10)}

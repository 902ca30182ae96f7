"""MajorityVoteReward, TTRL's label-free reward (arXiv:2504.16084): the vote and the scores by hand, no ground truth
read, and a run that trains on agreement while a weight-0 MathAccuracyReward reports the true accuracy."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.rewards import MajorityVoteReward, MathAccuracyReward
from rlvr_lightning.rewards.majority_vote import majority_labels
from rlvr_lightning.rewards.math import is_plain_number
from tests.rewards.test_math_reward import ScriptedTextPolicy, make_rollout, run_trainer

GROUPS = [
    [r"\boxed{4}", r"\boxed{4}", r"\boxed{5}", "no answer"],  # 4 wins 2 to 1
    [r"\boxed{0.5}", r"\boxed{\frac{1}{2}}", r"\boxed{0.5}", r"\boxed{3}"],  # "0.5" wins; 1/2 is judged equal
    [r"\boxed{7}", r"\boxed{8}", "x", "y"],  # a tie: the answer seen first
    ["nothing", "boxed", "here", "at all"],  # no answer: no label
]


@pytest.fixture(scope="module")
def reward():
    r = MajorityVoteReward(workers=1, string_fast_path=False)
    yield r
    r.close()


def test_majority_labels_by_hand():
    answers = ["4", "4", "5", None, "1", None, "2", "2", None, None]
    groups = [0, 0, 0, 0, 1, 1, 2, 2, 3, 3]
    assert majority_labels(answers, groups) == ["4"] * 4 + ["1"] * 2 + ["2"] * 2 + [None] * 2
    # the rows of a group need not be contiguous; a tie goes to the answer seen first
    assert majority_labels(["a", "b", "b", "a"], [0, 1, 0, 1]) == ["a", "b", "a", "b"]


def test_scores_agreement_with_the_group_majority_without_a_ground_truth(reward):
    rollout = make_rollout([text for group in GROUPS for text in group], group_size=4)  # metadata: {} per row
    scores = reward.score(rollout)
    assert scores.tolist() == [1, 1, 0, 0] + [1, 1, 1, 0] + [1, 0, 0, 0] + [0, 0, 0, 0]
    assert reward.kind == "shaping" and reward.is_correct(rollout, scores) is None
    assert reward.name == "majority_vote" and reward.num_errors == 0
    # the winner's share of its group's responses: 2/4, 2/4 (by string: 1/2 is judged equal, not counted), 1/4, 0
    assert reward.pop_metrics() == {"majority_ratio": pytest.approx(0.3125)} and reward.pop_metrics() == {}


def test_label_accuracy_compares_each_majority_with_the_ground_truth():
    reward = MajorityVoteReward(workers=1, answer_key="answer")
    try:
        golds = ["4", r"\frac{1}{2}", "8", "1"]  # right (4), right (0.5 = 1/2), wrong (7 won the tie), no label
        metadata = [{"answer": gold} for gold in golds for _ in range(4)]
        reward.score(make_rollout([text for group in GROUPS for text in group], metadata, group_size=4))
        assert reward.pop_metrics() == {"majority_ratio": pytest.approx(0.3125), "label_accuracy": 0.5}
        reward.score(make_rollout(GROUPS[0], group_size=4))  # rows without the key: no label accuracy
        assert reward.pop_metrics() == {"majority_ratio": 0.5}
    finally:
        reward.close()


def test_numeric_only_answers_vote_and_others_neither_vote_nor_score():
    reward = MajorityVoteReward(workers=1, numeric_only=True)
    try:
        texts = [r"\boxed{63 + 53}", r"\boxed{63 + 53}", r"\boxed{116}", r"\boxed{116.0}"]
        assert not is_plain_number("63 + 53")
        # without numeric_only "63 + 53" would win 2 to 1; with it, 116 wins and 116.0 agrees with it
        assert reward.score(make_rollout(texts, group_size=4)).tolist() == [0, 0, 1, 1]
    finally:
        reward.close()


def test_a_run_trains_on_agreement_and_watches_the_ground_truth(in_tmp_dir):
    torch.manual_seed(0)
    examples = [  # the majority is right on the first prompt and wrong on the second
        {"prompt": "2 + 2?", "answer": "4", "responses": [r"\boxed{4}", r"\boxed{4}", r"\boxed{5}", "?"]},
        {"prompt": "3 + 3?", "answer": "6", "responses": [r"\boxed{7}", r"\boxed{7}", r"\boxed{6}", r"\boxed{7}"]},
    ]
    majority = MajorityVoteReward(workers=1, answer_key="answer")
    truth = MathAccuracyReward(workers=1, weight=0.0)
    module = RLVRModule(ScriptedTextPolicy(), group_size=4, optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    trainer, recorder = run_trainer(
        module, [majority, truth], examples * 2, val=examples, batch_size=2, steps=2, val_check_interval=1
    )
    assert len(recorder.steps) == 2
    for step in recorder.steps:  # the second after a validation, whose greedy rows must not count
        assert step["train/rewards/majority_vote"] == pytest.approx(5 / 8)  # 2 of 4, then 3 of 4
        assert step["train/rewards/math_accuracy"] == pytest.approx(3 / 8)  # 2 of 4, then 1 of 4
        assert step["train/reward_mean"] == pytest.approx(5 / 8)  # the ground truth's weight is 0
        assert step["train/rewards/majority_vote/majority_ratio"] == pytest.approx(5 / 8)
        assert step["train/rewards/majority_vote/label_accuracy"] == pytest.approx(1 / 2)  # 4 right, 7 wrong
    # validation answers once per prompt (each prompt's first response): accuracy is the task reward's, 1 of 2
    assert trainer.callback_metrics["val/accuracy"] == pytest.approx(1 / 2)


def ttrl_majority_vote(answers):
    """TTRL's `_majority_vote` (PRIME-RL/TTRL c46b671, verl/verl/trainer/ppo/ttrl_utils.py) restated on answers
    already extracted: the most common of the non-None answers by `Counter.most_common(1)`, "None" when there is
    none."""
    from collections import Counter

    kept = [answer for answer in answers if answer is not None]
    if not kept:
        return "None"
    return Counter(kept).most_common(1)[0][0]


def test_the_vote_is_ttrls_on_random_groups_with_ties():
    generator = torch.Generator().manual_seed(0)
    choices = ["1", "2", "3", None]
    for _ in range(500):
        size = int(torch.randint(1, 9, (1,), generator=generator))
        answers = [choices[int(i)] for i in torch.randint(0, 4, (size,), generator=generator)]
        label = majority_labels(answers, [0] * size)[0]
        assert (label if label is not None else "None") == ttrl_majority_vote(answers), answers

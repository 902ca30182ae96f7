import pytest
import torch

from rlvr_lightning.rewards import RewardCallback, SortDistanceReward, SortInclusionOrderingReward
from rlvr_lightning.rollout import Rollout


def make_rollout(prompts, responses):
    prompts, responses = torch.tensor(prompts), torch.tensor(responses)
    n = len(responses)
    return Rollout(
        prompt_ids=prompts,
        prompt_mask=torch.ones_like(prompts),
        response_ids=responses,
        response_mask=torch.ones(responses.shape),
        group_index=torch.arange(n),
        group_size=1,
        truncated=torch.zeros(n, dtype=torch.bool),
    )


# The lecture's worked examples (CS336 spring 2025 lecture 17, simple_task()).
LECTURE_PROMPTS = [[3, 1, 0, 2]] * 3
LECTURE_RESPONSES = [[0, 1, 2, 3], [7, 2, 2, 5], [0, 3, 1, 2]]


def test_sort_distance_matches_lecture_examples():
    rollout = make_rollout(LECTURE_PROMPTS, LECTURE_RESPONSES)
    # sorted prompt is [0, 1, 2, 3]: all 4 match; only position 2 matches; only position 0 matches
    assert SortDistanceReward().score(rollout).tolist() == [4.0, 1.0, 1.0]


def test_inclusion_ordering_matches_lecture_examples():
    rollout = make_rollout(LECTURE_PROMPTS, LECTURE_RESPONSES)
    # [0,1,2,3]: inclusion 4 + ordering 3; [7,2,2,5]: inclusion 1 (the 2) + ordering 2 (2<=2, 2<=5);
    # [0,3,1,2]: inclusion 4 + ordering 2 (0<=3, 1<=2)
    assert SortInclusionOrderingReward().score(rollout).tolist() == [7.0, 3.0, 6.0]


def test_inclusion_multiset_counts_occurrences_once():
    rollout = make_rollout([[3, 3, 1, 0]], [[3, 0, 0, 1]])
    # lecture rule: each of 3, 3, 1, 0 appears somewhere -> 4; multiset: min counts 3:1, 1:1, 0:1 -> 3
    # ordering: 3<=0 no, 0<=0 yes, 0<=1 yes -> 2
    assert SortInclusionOrderingReward().score(rollout).tolist() == [6.0]
    assert SortInclusionOrderingReward(multiset=True).score(rollout).tolist() == [5.0]


def test_exact_sort_is_correctness():
    rollout = make_rollout([[3, 1, 0, 2], [1, 1, 0, 0]], [[0, 1, 2, 3], [0, 1, 1, 1]])
    reward = SortInclusionOrderingReward()
    scores = reward.score(rollout)
    # the second response scores the maximum 7 without being the sorted prompt [0, 0, 1, 1]
    assert scores.tolist() == [7.0, 7.0]
    assert reward.is_correct(rollout, scores).tolist() == [True, False]


def test_default_names_and_weights():
    assert SortDistanceReward().name == "sort_distance"
    assert SortInclusionOrderingReward(weight=0.5, name="sio").name == "sio"
    with pytest.raises(ValueError, match="on_error"):
        SortDistanceReward(on_error="ignore")


class FailsOnOddRows(RewardCallback):
    def score_row(self, rollout, i):
        if i % 2:
            raise RuntimeError("bad row")
        return 1.0


def test_row_failure_costs_only_that_row():
    rollout = make_rollout([[0, 1]] * 4, [[0, 1]] * 4)
    reward = FailsOnOddRows()
    assert reward(rollout).tolist() == [1.0, 0.0, 1.0, 0.0]
    assert reward.pop_errors() == 2
    assert reward.pop_errors() == 0
    with pytest.raises(RuntimeError, match="bad row"):
        FailsOnOddRows(on_error="raise")(rollout)


class BrokenBatch(RewardCallback):
    def score(self, rollout):
        raise ValueError("whole batch broken")


def test_whole_batch_failure_is_zero_and_counted():
    rollout = make_rollout([[0, 1]] * 3, [[0, 1]] * 3)
    reward = BrokenBatch()
    assert reward(rollout).tolist() == [0.0, 0.0, 0.0]
    assert reward.pop_errors() == 3


class HangsOnRowOne(RewardCallback):
    def score_row(self, rollout, i):
        if i == 1:
            import time

            time.sleep(30)
        return 1.0


def test_a_hanging_row_costs_that_row_only():
    import time

    rollout = make_rollout([[0, 1]] * 3, [[0, 1]] * 3)
    # the step's limit: the other rows must finish within it, even on a loaded machine
    reward = HangsOnRowOne(timeout_s=1.0)
    started = time.monotonic()
    assert reward(rollout).tolist() == [1.0, 0.0, 1.0]
    assert time.monotonic() - started < 5
    assert reward.pop_errors() == 1
    with pytest.raises(ValueError, match="timeout_s"):
        HangsOnRowOne(timeout_s=0)


def stop_rollout(responses, eos=9):
    """Prompt [2, 0, 1] (sorted: 0, 1, 2); responses end at their first `eos` (a truncated one has none)."""
    from rlvr_lightning.policies.toy_sort import ToySortPolicy

    rollout = make_rollout([[2, 0, 1]] * len(responses), responses)
    policy = ToySortPolicy(vocab_size=10, prompt_length=3, response_length=len(responses[0]), eos_token=eos)
    rollout.response_mask, rollout.truncated = policy._response_mask(rollout.response_ids)
    return rollout


def test_sort_and_stop_exact_by_hand():
    from rlvr_lightning.rewards import SortAndStopReward

    rollout = stop_rollout([[0, 1, 2, 9, 5], [0, 1, 2, 3, 9], [0, 9, 2, 9, 9], [0, 1, 2, 4, 4], [1, 1, 2, 9, 0]])
    reward = SortAndStopReward(stop_bonus=0.5)
    # 3 + stop; 3, ran on; 1 (position 2 is after the end); 3, cut off; 2 + stop
    assert reward.score(rollout).tolist() == [3.5, 3.0, 1.0, 3.0, 2.5]
    assert reward.is_correct(rollout, reward.score(rollout)).tolist() == [True, False, False, False, False]


def test_sort_and_stop_any_by_hand():
    from rlvr_lightning.rewards import SortAndStopReward

    rollout = stop_rollout([[0, 1, 2, 9, 5], [0, 1, 2, 3, 9], [0, 9, 2, 9, 9], [0, 1, 2, 4, 4], [1, 1, 2, 7, 9]])
    reward = SortAndStopReward(stop="any", stop_bonus=0.0)
    # anywhere after the answer is fine; stopping inside it loses positions; cut off at the budget scores 0
    assert reward.score(rollout).tolist() == [3.0, 3.0, 1.0, 0.0, 2.0]
    assert reward.is_correct(rollout, reward.score(rollout)).tolist() == [True, True, False, False, False]
    with pytest.raises(ValueError, match="stop='never' is not valid"):
        SortAndStopReward(stop="never")

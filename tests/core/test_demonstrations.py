"""SDPO's demonstrations (core/demonstrations.py), by hand."""

import torch

from rlvr_lightning.core.demonstrations import demonstration_rows

# three groups of four: one success at row 2 and one at row 3; none; successes at rows 8 and 9
REWARD = torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0, 0.5, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
GROUPS = torch.arange(3).repeat_interleave(4)


def test_each_row_learns_from_the_first_other_success_of_its_group():
    # row 2 skips itself for row 3, row 3 takes row 2; row 8 takes row 9, the rest of that group row 8
    expected = [2, 2, 3, 2, -1, -1, -1, -1, 9, 8, 8, 8]
    assert demonstration_rows(REWARD, GROUPS, threshold=1.0).tolist() == expected


def test_with_itself_allowed_a_success_demonstrates_for_itself_and_the_first_for_the_rest():
    expected = [2, 2, 2, 2, -1, -1, -1, -1, 8, 8, 8, 8]
    assert demonstration_rows(REWARD, GROUPS, threshold=1.0, exclude_self=False).tolist() == expected


def test_the_threshold_decides_what_a_success_is():
    # at 0.5, row 5's half reward demonstrates for its group; row 5 itself has no other success
    expected = [2, 2, 3, 2, 5, -1, 5, 5, 9, 8, 8, 8]
    assert demonstration_rows(REWARD, GROUPS, threshold=0.5).tolist() == expected


def test_a_lone_success_has_no_demonstration_of_its_own():
    reward, groups = torch.tensor([1.0, 0.0]), torch.tensor([0, 0])
    assert demonstration_rows(reward, groups, 1.0).tolist() == [-1, 0]


def test_groups_need_not_be_contiguous():
    # the rows of prompt 0 are 0, 2, 4 and those of prompt 1 are 1, 3, 5 (a shuffled or concatenated rollout)
    reward = torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 1, 0, 1, 0, 1])
    assert demonstration_rows(reward, groups, 1.0).tolist() == [4, 5, 4, 1, -1, 1]

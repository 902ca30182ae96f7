import pytest
import torch

from rlvr_lightning.rollout import Rollout, TokenSource


def rollout(prompt_len, response_len, groups, group_size=2, fill=1):
    n = groups * group_size
    return Rollout(
        prompt_ids=torch.full((n, prompt_len), fill),
        prompt_mask=torch.ones(n, prompt_len, dtype=torch.long),
        response_ids=torch.full((n, response_len), fill),
        response_mask=torch.ones(n, response_len),
        group_index=torch.arange(groups).repeat_interleave(group_size),
        group_size=group_size,
        truncated=torch.zeros(n, dtype=torch.bool),
        metadata=[{"row": fill}] * n,
        rewards={"r": torch.full((n,), float(fill))},
        reward=torch.full((n,), float(fill)),
    )


def test_select_keeps_rows_of_every_field():
    r = rollout(2, 3, groups=2)
    r.response_ids = torch.arange(12).view(4, 3)
    picked = r.select(torch.tensor([3, 0]))
    assert picked.response_ids.tolist() == [[9, 10, 11], [0, 1, 2]]
    assert picked.group_index.tolist() == [1, 0]
    assert picked.rewards["r"].shape == (2,)


def test_a_bool_mask_selects_the_rows_it_marks_in_every_field():
    r = rollout(2, 3, groups=2)
    r.response_ids = torch.arange(12).view(4, 3)
    r.metadata = [{"row": i} for i in range(4)]
    picked = r.select(torch.tensor([False, True, False, True]))
    assert picked.response_ids.tolist() == [[3, 4, 5], [9, 10, 11]]
    assert [m["row"] for m in picked.metadata] == [1, 3]  # not rows 0 and 1, as a list indexed by False/True
    with pytest.raises(ValueError, match=r"a row mask must be bool\[4\], got shape \(2,\)"):
        r.select(torch.tensor([True, False]))


def test_concat_pads_prompts_left_responses_right_and_renumbers_groups():
    a, b = rollout(2, 3, groups=1, fill=1), rollout(3, 1, groups=2, fill=2)
    both = Rollout.concat([a, b])
    assert both.prompt_ids.tolist()[0] == [0, 1, 1] and both.prompt_mask.tolist()[0] == [0, 1, 1]
    assert both.response_ids.tolist()[2] == [2, 0, 0] and both.response_mask.tolist()[2] == [1, 0, 0]
    assert both.group_index.tolist() == [0, 0, 1, 1, 2, 2]
    assert both.num_groups == 3 and both.metadata[-1] == {"row": 2}
    assert both.reward.tolist() == [1, 1, 2, 2, 2, 2] and both.rewards["r"].shape == (6,)
    assert both.old_log_probs is None


def test_concat_of_selected_groups_keeps_every_group_its_own_index():
    # dynamic sampling keeps groups 0 and 2 of one round, then adds a round of one group: three prompts
    kept = rollout(2, 3, groups=3).select(torch.tensor([0, 1, 4, 5]))
    both = Rollout.concat([kept, rollout(2, 3, groups=1, fill=2)])
    assert both.group_index.tolist() == [0, 0, 1, 1, 2, 2]
    # shuffled for a mini-batch, rows of different prompts never share a run
    shuffled = both.select(torch.tensor([2, 4, 0, 5, 3, 1]))
    assert shuffled.prompt_runs().row_run.tolist() == [0, 1, 2, 3, 4, 5]


def test_prompt_runs_of_equal_and_unequal_groups():
    r = rollout(2, 3, groups=3)  # group_index 0 0 1 1 2 2
    runs = r.prompt_runs()
    assert (
        runs.first_rows.tolist() == [0, 2, 4] and runs.row_run.tolist() == [0, 0, 1, 1, 2, 2] and runs.run_length == 2
    )
    assert r.prompt_runs() is runs  # computed once
    uneven = r.select(torch.tensor([3, 0, 1, 4]))  # groups 1 | 0 0 | 2
    runs = uneven.prompt_runs()
    assert runs.first_rows.tolist() == [0, 1, 3] and runs.row_run.tolist() == [0, 1, 1, 2] and runs.run_length == 0


def multi_turn_rollout():
    """Row 0: 2 sampled | 3 tool | 2 sampled | 1 pad; row 1: 2 sampled | 2 forced | 1 sampled | 3 pad;
    row 2: 8 sampled."""
    S, T, F = TokenSource.SAMPLED, TokenSource.TOOL, TokenSource.FORCED
    source = torch.tensor([[S, S, T, T, T, S, S, 0], [S, S, F, F, S, 0, 0, 0], [S] * 8])
    r = rollout(2, 8, groups=1, group_size=3)
    r.response_source = source
    r.response_mask = (source == S).float()
    return r


def test_lengths_and_turns_of_responses_with_holes():
    r = multi_turn_rollout()
    assert r.response_mask.sum(-1).tolist() == [4, 3, 8]  # sampled tokens only: not the lengths
    assert r.response_lengths().tolist() == [7, 5, 8]
    assert r.num_turns().tolist() == [2, 1, 1]  # a tool observation starts a turn, a forced close does not
    plain = rollout(2, 3, groups=1)
    plain.response_mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert plain.response_lengths().tolist() == [2, 0] and plain.num_turns().tolist() == [1, 0]


def test_select_and_concat_keep_the_turn_structure():
    r = multi_turn_rollout()
    assert r.select(torch.tensor([1])).response_source.tolist() == [r.response_source[1].tolist()]
    both = Rollout.concat([r, rollout(2, 3, groups=1, group_size=3)])
    assert both.response_source is None  # kept only when every part has it (as every optional field)
    twice = Rollout.concat([r, r])
    assert twice.response_lengths().tolist() == [7, 5, 8] * 2

"""`ReasoningGymTask`: a deterministic, resumable stream of reasoning-gym prompts, shared across ranks as
every task's is, with validation questions held out and its difficulty levels in the checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr_lightning.data import RLVRDataModule
from rlvr_lightning.data.prompt_streams import PromptStream, example_source
from rlvr_lightning.data.reasoning_gym_task import ReasoningGymTask
from rlvr_lightning.data.templates import R1_ZERO_TEMPLATE
from tests.envs.rg_support import USED_DATASETS, small_task

ROOT = Path(__file__).resolve().parents[2]


def questions(examples) -> list[str]:
    return [e["question"] for e in examples]


def test_examples_carry_the_entry_the_scorer_needs_and_follow_the_template():
    task = small_task(template="r1_zero")
    example = task.train_example(0)
    assert example["prompt"] == R1_ZERO_TEMPLATE.replace("{question}", example["question"])
    assert example["rg_dataset"] in task.dataset_names
    assert example["rg_entry"]["answer"] == example["answer"]
    assert example["rg_entry"]["question"] == example["question"]
    assert example["rg_config"]["max_terms"] if example["rg_dataset"] == "basic_arithmetic" else True


def test_stream_is_a_function_of_seed_and_index_and_mixes_by_weight():
    first = small_task()
    again = small_task()
    indices = [0, 5, 17, 3, 400]
    assert questions(first.train_example(i) for i in indices) == questions(again.train_example(i) for i in indices)
    assert questions(first.train_example(i) for i in range(20)) != questions(
        small_task(seed=4).train_example(i) for i in range(20)
    )
    weighted = ReasoningGymTask(
        datasets=[{**USED_DATASETS[0], "weight": 3.0}, {**USED_DATASETS[1], "weight": 1.0}], num_val=0
    )
    names = [weighted.train_example(i)["rg_dataset"] for i in range(400)]
    assert 0.68 < names.count("basic_arithmetic") / 400 < 0.82  # 3:1 -> 0.75


def test_stream_is_the_same_in_another_process_with_another_hash_seed():
    """Ranks are separate processes: string hashing (set order) must not change the prompts."""
    script = (
        "import json; from tests.envs.rg_support import small_task; t = small_task(); "
        "print(json.dumps([t.train_example(i)['question'] for i in range(30)] + "
        "[e['question'] for e in t.val_examples()]))"
    )
    hash_seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"  # not this process's
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    task = small_task()
    here = [task.train_example(i)["question"] for i in range(30)] + [e["question"] for e in task.val_examples()]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == here


def test_validation_questions_never_appear_in_training():
    task = small_task(num_val=30)
    held_out = {(e["rg_dataset"], e["question"]) for e in task.val_examples()}
    assert len(held_out) == 90, "30 distinct questions per dataset"
    trained = {(e["rg_dataset"], e["question"]) for e in (task.train_example(i) for i in range(2000))}
    assert not held_out & trained


def test_ranks_read_disjoint_shares_of_the_single_process_stream():
    task = small_task()
    source = example_source(task.train_dataset(), seed=0)
    single = [questions_of(batch) for batch in _batches(PromptStream(source, 8, 0, 1), 3)]
    ranks = [[questions_of(batch) for batch in _batches(PromptStream(source, 4, r, 2), 3)] for r in range(2)]
    for j in range(3):
        assert ranks[0][j] + ranks[1][j] == single[j], "rank r's share of batch j: examples (2j + r) * 4 ..."


def questions_of(batch) -> list[str]:
    return [meta["question"] for meta in batch["metadata"]]


def _batches(stream, count):
    iterator = iter(stream)
    return [next(iterator) for _ in range(count)]


def test_resume_continues_the_stream_with_the_checkpointed_levels():
    data = RLVRDataModule(small_task(), batch_size=4, seed=0)
    batches = iter(data.train_prompts())
    next(batches)
    data.source_position += 4  # what on_before_batch_transfer counts for a consumed batch
    data.task.levels["basic_arithmetic"].raise_level()
    state = data.state_dict()
    expected = [questions_of(next(iter(data.train_prompts())))]

    resumed = RLVRDataModule(small_task(), batch_size=4, seed=0)
    resumed.load_state_dict(state)
    assert resumed.task.levels["basic_arithmetic"].state_dict() == {"num_terms": 1, "num_digits": 1}
    assert [questions_of(next(iter(resumed.train_prompts())))] == expected
    assert state["task"] == {"levels": resumed.task.state_dict()["levels"]}


@pytest.mark.parametrize(
    "options, message",
    [
        ({"datasets": []}, "at least one dataset"),
        ({"datasets": ["no_such_dataset"]}, "'no_such_dataset' is not a reasoning-gym dataset; choose from"),
        ({"datasets": [{"name": "leg_counting", "wieght": 2}]}, r"unknown keys \['wieght'\]; valid keys"),
        ({"datasets": [{"name": "leg_counting", "weight": 0}]}, "weight must be > 0"),
        ({"datasets": ["leg_counting", "leg_counting"]}, "each name once"),
        ({"datasets": [{"name": "leg_counting", "levels": {"legs": 1}}]}, "no curriculum attribute 'legs'"),
        ({"datasets": [{"name": "spell_backward", "levels": 9}]}, None),  # an int is capped at each attribute's top
        ({"datasets": [{"name": "spell_backward", "levels": {"word_len": 9}}]}, "level 9 is out of range 0..4"),
        ({"datasets": ["leg_counting"], "range_mode": "all"}, "range_mode='all' is not valid"),
        ({"datasets": ["leg_counting"], "template": "nothing"}, "neither one of"),
        ({"datasets": ["leg_counting"], "curriculum": {"raise_at": 0.1, "lower_at": 0.5}}, "lower_at < raise_at"),
    ],
)
def test_bad_options_are_refused_naming_the_option(options, message):
    if message is None:
        ReasoningGymTask(**options)
        return
    with pytest.raises(ValueError, match=message):
        ReasoningGymTask(**options)

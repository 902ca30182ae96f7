"""`InlineTask`: examples given in the config."""

from __future__ import annotations

import itertools

import pytest

from rlvr_lightning.data.datamodule import RLVRDataModule
from rlvr_lightning.data.inline_task import InlineTask

EXAMPLES = [{"prompt": f"q{i}", "answer": str(i)} for i in range(5)]


def test_stream_visits_every_example_once_per_pass_in_a_seeded_order():
    stream = InlineTask(EXAMPLES, seed=3).train_dataset()
    first = [e["prompt"] for e in itertools.islice(iter(stream), 15)]
    for start in (0, 5, 10):
        assert sorted(first[start : start + 5]) == [f"q{i}" for i in range(5)]
    assert first[:5] != first[5:10] or first[5:10] != first[10:15]  # passes are reshuffled
    again = [e["prompt"] for e in itertools.islice(iter(InlineTask(EXAMPLES, seed=3).train_dataset()), 15)]
    assert again == first
    ordered = [e["prompt"] for e in itertools.islice(iter(InlineTask(EXAMPLES, shuffle=False).train_dataset()), 7)]
    assert ordered == ["q0", "q1", "q2", "q3", "q4", "q0", "q1"]


def test_batches_carry_metadata_and_the_stream_outlasts_the_examples():
    data = RLVRDataModule(InlineTask(EXAMPLES, val_examples=EXAMPLES[:2]), batch_size=2)
    batches = list(itertools.islice(iter(data.train_dataloader()), 6))  # 12 prompts from 5 examples
    assert all(len(b["prompt"]) == 2 for b in batches)
    for batch in batches:
        for prompt, meta in zip(batch["prompt"], batch["metadata"], strict=True):
            assert meta == {"answer": prompt[1:]}
    val = list(data.val_dataloader())
    assert [b["prompt"] for b in val] == [["q0", "q1"]]


def test_finite_mode_and_validation():
    task = InlineTask(EXAMPLES, repeat=False)
    assert len(task.train_dataset()) == 5 and task.val_dataset() is None
    with pytest.raises(ValueError, match=r"examples\[1\] must be a dict with a 'prompt' key"):
        InlineTask([{"prompt": "a"}, {"question": "b"}])
    with pytest.raises(ValueError, match="at least one example"):
        InlineTask([])


def test_a_config_s_strings_stay_strings(tmp_path):
    """A prompt with a colon, a quoted number: parsed from YAML as written, not again as YAML."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_class_arguments(InlineTask, "task")
    config = parser.parse_string(
        "task:\n  examples:\n"
        '    - {prompt: "Count: 1 2", answer: "3", tests: [{input: "2", output: "4"}], weight: 2}\n'
        '    - {prompt: [{role: user, content: "Q: x"}], answer: 4.5, responses: ["4", "a: b"], deep: [[["7"]]]}\n'
    )
    task = parser.instantiate(config).task
    assert task.examples == [
        {"prompt": "Count: 1 2", "answer": "3", "tests": [{"input": "2", "output": "4"}], "weight": 2},
        {
            "prompt": [{"role": "user", "content": "Q: x"}],
            "answer": 4.5,
            "responses": ["4", "a: b"],
            "deep": [[["7"]]],
        },
    ]

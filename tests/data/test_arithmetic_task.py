"""ArithmeticTask: seeded, held-out by construction, correct answers, templates, knobs."""

from __future__ import annotations

import itertools
import re

import pytest
from torch.utils.data import DataLoader

from rlvr_lightning.data.arithmetic import ArithmeticTask, evaluate
from rlvr_lightning.data.datamodule import RLVRDataModule
from rlvr_lightning.data.templates import BOXED_INSTRUCTION, POLICY_PROMPT_TEMPLATE, TEMPLATES, apply_template


@pytest.mark.parametrize(
    "operands, operators, value",
    [
        ([2, 3], ["+"], 5),
        ([2, 3], ["-"], -1),
        ([2, 3, 4], ["+", "*"], 14),  # precedence
        ([2, 3, 4], ["*", "+"], 10),
        ([20, 4, 5], ["/", "*"], 25),  # left to right within a term
        ([10, 4, 3], ["-", "-"], 3),
        ([7, 2], ["/"], 3.5),
    ],
)
def test_evaluate(operands, operators, value):
    assert evaluate(operands, operators) == value


def _train(task, n):
    return list(itertools.islice(iter(task.train_dataset()), n))


def test_examples_carry_answer_and_are_correct():
    task = ArithmeticTask(digits=2, operators="+-*", num_operands=3, num_val=50)
    for example in _train(task, 200) + task.val_examples():
        expression = example["expression"]
        numbers = [int(x) for x in re.findall(r"\d+", expression)]
        ops = re.findall(r" ([-+*/]) ", expression)
        assert len(numbers) == 3 and all(10 <= x <= 99 for x in numbers)
        assert int(example["answer"]) == evaluate(numbers, ops)
        assert example["question"] == f"What is {expression}?"
        assert example["prompt"] == f"What is {expression}?\n{BOXED_INSTRUCTION}"


def test_seeded_and_held_out_by_construction():
    task = ArithmeticTask(num_val=200)
    train = _train(task, 3000)
    val = task.val_examples()
    assert len(val) == 200 and len({e["expression"] for e in val}) == 200
    assert {e["expression"] for e in train}.isdisjoint(e["expression"] for e in val)
    assert all(task.is_held_out(e["expression"]) for e in val)
    assert _train(ArithmeticTask(num_val=200), 50) == train[:50]  # same seed, same stream
    assert ArithmeticTask(num_val=200).val_examples() == val
    assert _train(ArithmeticTask(seed=1), 50) != train[:50]
    assert [e["prompt"] for e in task.val_dataset()] == [e["prompt"] for e in val]


def test_fixed_training_pool_and_no_validation():
    task = ArithmeticTask(num_train=16, num_val=0)
    assert len(task.train_dataset()) == 16
    assert task.val_dataset() is None


def test_knobs():
    one_digit = _train(ArithmeticTask(digits=1, operators=["*"], num_val=0), 200)
    assert all(re.fullmatch(r"\d \* \d", e["expression"]) for e in one_digit)
    mixed = _train(ArithmeticTask(digits=3, min_digits=1, num_val=0), 300)
    lengths = {len(x) for e in mixed for x in re.findall(r"\d+", e["expression"])}
    assert lengths == {1, 2, 3}
    division = _train(ArithmeticTask(operators="/", num_val=0), 100)
    assert all(
        int(e["answer"]) * int(e["expression"].split(" / ")[1]) == int(e["expression"].split(" / ")[0])
        for e in division
    )
    positive = _train(ArithmeticTask(operators="-", allow_negative=False, num_val=0), 200)
    assert all(int(e["answer"]) >= 0 for e in positive)
    four = _train(ArithmeticTask(num_operands=4, num_val=0), 5)
    assert all(e["expression"].count("+") == 3 for e in four)


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_templates(template):
    example = _train(ArithmeticTask(template=template, num_val=0), 1)[0]
    assert example["prompt"] == apply_template(template, example["question"])
    assert template in POLICY_PROMPT_TEMPLATE
    if template == "r1_zero":
        assert example["prompt"].endswith("Assistant: <think>") and example["question"] in example["prompt"]
    custom = _train(ArithmeticTask(template="Q: {question}\nA: {", num_val=0), 1)[0]
    assert custom["prompt"] == f"Q: {custom['question']}\nA: {{"  # other braces are literal


def test_bad_arguments():
    with pytest.raises(ValueError, match="operators"):
        ArithmeticTask(operators="^")
    with pytest.raises(ValueError, match="num_operands"):
        ArithmeticTask(num_operands=1)
    with pytest.raises(ValueError, match="min_digits"):
        ArithmeticTask(digits=2, min_digits=3)
    with pytest.raises(ValueError, match="template"):
        ArithmeticTask(template="no placeholder")
    with pytest.raises(ValueError, match="expression"):
        ArithmeticTask(question_format="What?")
    with pytest.raises(ValueError, match="distinct held-out problems"):
        ArithmeticTask(digits=1, num_val=50).val_examples()  # 1-digit sums: only ~10 held out


def test_batches_through_the_data_module():
    data = RLVRDataModule(ArithmeticTask(num_val=8), batch_size=4, val_batch_size=8)
    batch = next(iter(data.train_dataloader()))
    assert len(batch["prompt"]) == 4 and {"answer", "question", "expression"} <= set(batch["metadata"][0])
    (val_batch,) = list(data.val_dataloader())
    assert len(val_batch["prompt"]) == 8
    assert isinstance(data.val_dataloader(), DataLoader)

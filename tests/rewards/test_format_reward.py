"""R1FormatReward (strict, lenient, R1-Zero prompts ending in <think>) and BoxedFormatReward."""

from __future__ import annotations

import pytest

from rlvr_lightning.data.templates import apply_template
from rlvr_lightning.rewards.format import BoxedFormatReward, R1FormatReward, r1_format_ok
from tests.rewards.test_math_reward import make_rollout

GOOD = "<think> 2 + 2 is 4 </think> <answer> 4 </answer>"

R1_CASES = [
    # (response, think_in_prompt, strict, lenient)
    (GOOD, False, True, True),
    ("<think>a</think><answer>4</answer>", False, True, True),
    ("\n<think>\nmulti\nline\n</think>\n\n<answer>\n4\n</answer>\n", False, True, True),
    ("<think></think> <answer>4</answer>", False, True, True),  # an empty thought is still the layout
    ("<think>a</think> <answer> </answer>", False, False, True),  # empty answer
    ("<think>a</think> so <answer>4</answer>", False, False, True),  # text between the blocks
    ("<think>a</think> <answer>4</answer> trailing", False, False, True),
    ("preamble <think>a</think> <answer>4</answer>", False, False, True),
    ("<think>a</think> <answer>4</answer><answer>5</answer>", False, False, True),  # two answers
    ("<think>a<think>b</think> <answer>4</answer>", False, False, True),  # nested think
    ("<answer>4</answer> <think>a</think>", False, False, False),  # wrong order
    ("<think>a</think> <answer>4", False, False, False),  # unclosed answer (truncated)
    ("<think> no end", False, False, False),
    ("4", False, False, False),
    ("", False, False, False),
    # R1-Zero: the prompt ends in "<think>", the response starts inside the block
    (" 2 + 2 is 4 </think> <answer> 4 </answer>", True, True, True),
    (" 2 + 2 is 4 </think> <answer> 4 </answer>", False, False, True),
    ("<think> x </think> <answer> 4 </answer>", True, True, True),  # repeated opening tag tolerated
    (" x </think> y <answer> 4 </answer>", True, False, True),
]


@pytest.mark.parametrize("text, think_in_prompt, strict, lenient", R1_CASES)
def test_r1_format(text, think_in_prompt, strict, lenient):
    assert r1_format_ok(text, strict=True, think_in_prompt=think_in_prompt) is strict
    assert r1_format_ok(text, strict=False, think_in_prompt=think_in_prompt) is lenient


def test_r1_reward_detects_the_r1_zero_prompt_per_row():
    r1_prompt = apply_template("r1_zero", "What is 2 + 2?")
    assert r1_prompt.endswith("Assistant: <think>")
    body = " 2 + 2 is 4 </think> <answer> 4 </answer>"
    rollout = make_rollout([body, body, GOOD], prompts=[r1_prompt, "What is 2 + 2?", "What is 2 + 2?"])
    reward = R1FormatReward()
    assert reward.kind == "format" and reward.name == "r1_format"
    scores = reward(rollout)
    assert scores.tolist() == [1.0, 0.0, 1.0]
    assert reward.is_correct(rollout, scores).tolist() == [True, False, True]
    assert R1FormatReward(think_in_prompt=True)(rollout).tolist() == [1.0, 1.0, 1.0]
    lenient = R1FormatReward(strict=False)
    assert lenient.name == "r1_format_lenient"
    assert lenient(make_rollout([GOOD + " and more", "nope"])).tolist() == [1.0, 0.0]


def test_format_checks_are_linear_on_hostile_input():
    import time

    hostile = ["<think>" * 200_000, "</think>" * 100_000 + "<answer>" * 100_000, "<answer>" + "x" * 1_000_000]
    t0 = time.process_time()  # CPU time: jobs that share the machine (parallel test workers) do not count
    for text in hostile:
        r1_format_ok(text, strict=True)
        r1_format_ok(text, strict=False)
    assert time.process_time() - t0 < 10.0


@pytest.mark.parametrize(
    "text, ok",
    [
        (r"so \boxed{68}", True),
        (r"$\boxed{\frac{1}{2}}$", True),
        (r"\boxed{}", False),
        (r"\boxed{68", False),
        ("68", False),
        (r"\boxed 5", True),
        ("", False),
    ],
)
def test_boxed_format(text, ok):
    reward = BoxedFormatReward(weight=0.5)
    rollout = make_rollout([text])
    scores = reward(rollout)
    assert scores.tolist() == [float(ok)]
    assert reward.kind == "format" and reward.weight == 0.5 and reward.name == "boxed_format"
    assert reward.is_correct(rollout, scores).tolist() == [ok]


def test_format_rewards_need_text():
    rollout = make_rollout(["x"])
    rollout.response_text = None
    with pytest.raises(ValueError, match="response_text"):
        R1FormatReward(on_error="raise")(rollout)
    reward = BoxedFormatReward()
    assert reward(rollout).tolist() == [0.0] and reward.pop_errors() == 1

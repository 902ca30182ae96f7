"""Answer extraction, normalisation and math equivalence (in-process and via MathVerifier)."""

from __future__ import annotations

import threading
import time

import pytest

from rlvr_lightning.grading.answers import (
    clean_answer,
    extract_answer,
    extract_answer_is,
    extract_boxed,
    extract_gsm8k,
    extract_last_number,
    extract_tagged,
    normalize_answer,
)
from rlvr_lightning.grading.math_equivalence import MathVerifier, answers_match

# ----------------------------------------------------------------------------- extraction

EXTRACTION_CASES = [
    # (extractor, text, expected)
    (extract_boxed, r"so \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),
    (extract_boxed, r"\boxed{1} then \boxed{2} finally \boxed{3}", "3"),
    (extract_boxed, r"$\boxed{ \text{5 apples}}$", r"\text{5 apples}"),
    (extract_boxed, r"\fbox{7}", "7"),
    (extract_boxed, r"the result is $\boxed 5$", "5"),
    (extract_boxed, r"\boxed{\{1,2\}}", r"\{1,2\}"),
    (extract_boxed, r"\boxed{a^{2}+b_{1}}", "a^{2}+b_{1}"),
    (extract_boxed, r"\boxed{1", None),
    (extract_boxed, r"\boxed{1} and later \boxed{2", None),  # the last box is unbalanced
    (extract_boxed, "no box here", None),
    (extract_boxed, r"\boxed{}", ""),  # empty: extract_answer treats it as not found
    (extract_tagged, "<think>hmm</think><answer> 42 </answer>", "42"),
    (extract_tagged, "<answer>1</answer> wait <answer>2</answer>", "2"),
    (extract_tagged, "<Answer>7</ANSWER>", "7"),
    (extract_tagged, "<answer>truncated", None),
    (extract_gsm8k, "She makes 9 * 2 = $18.\n#### 18", "18"),
    (extract_gsm8k, "#### 1,234", "1234"),
    (extract_gsm8k, "#### -5", "-5"),
    (extract_gsm8k, "#### $1,000.50", "1000.50"),
    (extract_gsm8k, "#### 3\nmore\n#### 4", "4"),
    (extract_gsm8k, "#### none", None),
    (extract_answer_is, "So the answer is 42.", "42"),
    (extract_answer_is, r"The final answer is $\frac{1}{2}$. I hope", r"\frac{1}{2}"),
    (extract_answer_is, "the answer is 3.5.", "3.5"),
    (extract_answer_is, "Answer: 7", "7"),
    (extract_answer_is, r"The answer is \$5.", "5"),
    (extract_answer_is, "the answer is 1. no wait, the answer is 2.", "2"),
    (extract_answer_is, "The final answer is **12**.", "12"),
    (extract_answer_is, "my answer isn't final", None),
    (extract_last_number, "47 + 21 = 68", "68"),
    (extract_last_number, "It costs $1,234.50 in total.", "1234.50"),
    (extract_last_number, "from -3 to −5", "-5"),
    (extract_last_number, r"\boxed{7}.", "7"),
    (extract_last_number, "1,2,3", "3"),
    (extract_last_number, "no digits", None),
]


@pytest.mark.parametrize("fn,text,expected", EXTRACTION_CASES)
def test_extraction(fn, text, expected):
    assert fn(text) == expected


def test_extract_answer_order_and_methods():
    text = r"<answer>\boxed{3}</answer> the answer is 4"
    assert extract_answer(text) == "3"  # boxed comes first
    assert extract_answer("<answer>x+1</answer>\n#### 5") == "x+1"
    assert extract_answer("blah\n#### 5") == "5"
    assert extract_answer("so the answer is 6.") == "6"
    assert extract_answer("#### 5", methods=("answer_is",)) is None
    assert extract_answer("nothing") is None
    assert extract_answer(None) is None and extract_answer("") is None
    with pytest.raises(ValueError):
        extract_answer("x", methods=("nope",))


def test_extraction_is_linear_on_hostile_input():
    big = "{" * 200_000 + "\\boxed{" + "{" * 200_000 + "x"
    hostile = [
        "\\boxed{" * 100_000,
        big,
        "answer is " * 100_000,
        "<answer>" * 100_000 + "</answer>",
        "####" * 100_000,
        ("1," * 300_000) + "5 cm",
        "5 " + "a" * 500_000 + "1",
    ]
    t0 = time.process_time()
    hostile.append("1," * 300_000 + "1.")
    for text in hostile:
        extract_answer(text)
        extract_last_number(text)
        normalize_answer(text)
    # ~1.5 s here; a quadratic pass over these 200k-1M character inputs would take hours. CPU time, not the
    # wall clock: jobs that share the machine (parallel test workers) do not count.
    assert time.process_time() - t0 < 15.0


# ----------------------------------------------------------------------------- normalisation

NORMALIZE_CASES = [
    ("  $1,000$ ", "1000"),
    ("1,234,567", "1234567"),
    (r"5\,000", "5000"),
    ("(1, 2)", "(1,2)"),  # a tuple is not a thousands separator
    ("(1,000, 2)", "(1,000,2)"),  # ambiguous inside brackets: left alone
    (r"\dfrac{1}{2}", r"\frac{1}{2}"),
    (r"\boxed{\tfrac{1}{2}}", r"\frac{1}{2}"),
    (r"90^\circ", "90"),
    ("90°", "90"),
    ("5 cm", "5"),  # documented: unit words after a plain number are dropped
    (r"5\text{ cm}", "5"),
    (r"\text{5 apples}", "5"),
    ("12 dollars.", "12"),
    ("2 x", "2 x"),  # single letters are variables, not units
    ("3 pi", "3 pi"),  # math words stay
    ("+5", "5"),
    ("- 3", "-3"),
    ("\u22123", "-3"),
    (r"10\%", "10%"),
    ("42.", "42"),
    ("ABC", "abc"),
    (r"\left( 1, 2 \right)", "(1,2)"),
    (r"\$5", "5"),
    ("", ""),
    (None, ""),
]


@pytest.mark.parametrize("raw,expected", NORMALIZE_CASES)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


def test_clean_answer_keeps_meaning():
    assert clean_answer(r"\boxed{1}+\boxed{2}") == r"\boxed{1}+\boxed{2}"  # not a single box
    assert clean_answer(" 0.5 ") == "0.5"


# ----------------------------------------------------------------------------- equivalence

MATCH_CASES = [
    # (prediction, gold, expected)
    ("0.5", r"\frac{1}{2}", True),
    ("1/2", "0.5", True),
    (r"\dfrac12", "1/2", True),
    (".5", "1/2", True),
    ("0.50", r"\frac12", True),
    ("1,000", "1000", True),
    ("1000", "1,000", True),
    ("$5", "5", True),
    (r"\$5", "5", True),
    ("5 cm", "5", True),  # units stripped (documented)
    (r"\text{5 apples}", "5", True),
    ("-3", "- 3", True),
    ("\u22123", "-3", True),
    ("+7", "7", True),
    (r"50\%", "50", True),  # math-verify: a percentage matches its number ...
    ("50%", "0.5", True),  # ... and its fraction
    (r"10^\circ", "10", True),
    (r"3\sqrt{2}", r"\sqrt{18}", True),
    ("(1, 2)", "(1,2)", True),
    (r"\{1,2\}", r"\{2,1\}", True),
    ("x=5", "5", True),  # math-verify accepts an assignment to the gold value
    (r"2\pi", r"2 \pi", True),
    ("A", "a", True),
    ("1.8e1", "18", True),  # scientific notation compares as a number (math-verify alone reads e as Euler's)
    ("1e3", "1000", True),
    ("2.5E-1", "1/4", True),
    ("-3e2", "-300", True),
    ("18", "1.8e1", True),
    ("1.8e1", "19", False),
    ("0.33", "1/3", False),  # close is not equal
    ("12", "1.2", False),
    ("-5", "5", False),
    ("100", "1000", False),
    ("1,001", "1000", False),
    ("99", "9.9", False),
    (r"\frac{1}{3}", "0.3", False),
    ("1/2", "2", False),
    ("2", "3", False),
    ("5 m", "5", True),  # not stripped by normalize_answer, but math-verify drops the unit
    ("5 cm", "6", False),
    ("", "5", False),
    (None, "5", False),
    ("5", "", False),
]


@pytest.mark.parametrize("pred,gold,expected", MATCH_CASES)
def test_answers_match(pred, gold, expected):
    assert answers_match(pred, gold) is expected


def test_answers_match_off_main_thread():
    out = []
    t = threading.Thread(target=lambda: out.append(answers_match("1/2", "0.5")))
    t.start()
    t.join()
    assert out == [True]


# ----------------------------------------------------------------------------- MathVerifier

TIMEOUT = 2.0


@pytest.fixture(scope="module")
def verifier():
    with MathVerifier(workers=2, timeout_s=TIMEOUT) as v:
        yield v


def test_verifier_scores_completions(verifier):
    completions = [None if p is None else f"Reasoning... so $\\boxed{{{p}}}$." for p, _, _ in MATCH_CASES]
    golds = [g for _, g, _ in MATCH_CASES]
    scores, failed = verifier.score(completions, golds)
    assert failed == 0
    assert scores == [1.0 if e else 0.0 for _, _, e in MATCH_CASES]


def test_verifier_extraction_paths(verifier):
    completions = [
        "<answer>1/2</answer>",
        "blah\n#### 1,234",
        "So the answer is 0.75.",
        r"first \boxed{3} then \boxed{4}",
        "no answer at all: 5",
        "",
        None,
    ]
    golds = ["0.5", "1234", r"\frac{3}{4}", "4", "5", "5", "5"]
    assert verifier.score(completions, golds) == ([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0], 0)
    with pytest.raises(ValueError):
        verifier.score(["a"], [])


def test_hostile_rows_cost_only_their_row(verifier):
    normal = [(r"\boxed{\frac{1}{2}}", "0.5", 1.0), (r"\boxed{7}", "8", 0.0), ("#### 1,000", "1000", 1.0)]
    hostile = [
        (r"\boxed{9^{9^{9^9}}}", "5"),  # sympy never finishes: killed at the budget
        ("\\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}", "1"),  # over the length cap: 0 unjudged
        ("x" * 1_000_000 + r" \boxed{2}", "3"),  # 1 MB: extraction is linear
        ("y" * 1_000_000, "3"),
    ]
    preds = [p for p, _ in hostile[:2]] + [p for p, _, _ in normal] + [p for p, _ in hostile[2:]]
    golds = [g for _, g in hostile[:2]] + [g for _, g, _ in normal] + [g for _, g in hostile[2:]]
    t0 = time.monotonic()
    scores, failed = verifier.score(preds, golds)
    elapsed = time.monotonic() - t0
    assert scores == [0.0, 0.0] + [s for _, _, s in normal] + [0.0, 0.0]
    assert failed == 1
    assert elapsed < TIMEOUT * 2 + 5
    # The pool recovered: a normal batch right after is judged as usual.
    assert verifier.score([r"\boxed{0.25}"], ["1/4"]) == ([1.0], 0)


def test_duplicate_hostile_rows_are_judged_once(verifier):
    preds = [r"\boxed{9^{9^{9^9}}}"] * 4 + [r"\boxed{2/4}"]
    t0 = time.monotonic()
    scores, failed = verifier.score(preds, ["5"] * 4 + ["0.5"])
    assert time.monotonic() - t0 < TIMEOUT + 5
    assert scores == [0.0] * 4 + [1.0] and failed == 4


def test_deep_nesting_under_the_cap_is_bounded(verifier):
    deep = "\\boxed{" + "{" * 900 + "1" + "}" * 900 + "}"  # under 2000 chars: reaches the parser
    t0 = time.monotonic()
    scores, failed = verifier.score([deep, r"\boxed{3}"], ["1", "3"])
    assert time.monotonic() - t0 < TIMEOUT * 2 + 5
    assert scores[1] == 1.0 and failed <= 1


def test_verifier_from_a_thread_and_close_reaps_workers():
    v = MathVerifier(workers=1, timeout_s=TIMEOUT)
    out = []
    t = threading.Thread(target=lambda: out.append(v.score([r"\boxed{9^{9^{9^9}}}", r"\boxed{1/2}"], ["1", "0.5"])))
    t.start()
    t.join(timeout=30)
    assert out == [([0.0, 1.0], 1)]
    pids = v.worker_pids()
    assert len(pids) == 1
    v.close()
    for pid in pids:
        with pytest.raises(ChildProcessError):
            import os

            os.waitpid(pid, os.WNOHANG)  # already reaped by close(): not our child any more
    with pytest.raises(RuntimeError):
        v.score([r"\boxed{10^{10^{10}}}"], ["1"])


def test_verifier_without_string_fast_path(verifier):
    verifier.string_fast_path = False  # math-verify judges every pair, strings are the fallback
    try:
        preds = [r"\boxed{42}", r"\boxed{\text{hello}}", r"\boxed{43}", r"\boxed{\frac{84}{2}}"]
        assert verifier.score(preds, ["42", r"\text{hello}", "42", "42"]) == ([1.0, 1.0, 0.0, 1.0], 0)
    finally:
        verifier.string_fast_path = True


def _wait_dead(pids, timeout=30.0):
    """Until every pid has exited (a zombie or reaped): SIGKILL takes effect asynchronously."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                        break
            except (FileNotFoundError, ProcessLookupError):
                break
            time.sleep(0.01)


def _kill_when_judging(verifier, pids, killed_at):
    """Kill `pids` once a worker has acknowledged a row (deterministic: the row is being judged)."""
    import os
    import signal

    deadline = time.monotonic() + 60
    while not verifier.judging_pids() and time.monotonic() < deadline:
        time.sleep(0.005)
    killed_at.append(time.monotonic())
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


def test_worker_crash_costs_only_its_row(verifier):
    verifier.score([r"\boxed{1}"], ["2"])  # make sure the pool is up
    pids = verifier.worker_pids()
    killed_at: list[float] = []
    killer = threading.Thread(target=_kill_when_judging, args=(verifier, pids, killed_at))
    killer.start()
    scores, failed = verifier.score([r"\boxed{9^{9^{9^9}}}"], ["5"])
    returned = time.monotonic()
    killer.join()
    assert (scores, failed) == ([0.0], 1)
    assert returned - killed_at[0] < TIMEOUT  # noticed the crash, did not wait for the budget
    # The idle worker was killed too, maybe not dead yet: a row sent to it before it dies is
    # never acknowledged, so it is re-sent to a fresh worker instead of being scored 0.
    assert verifier.score([r"\boxed{3/6}"], ["0.5"]) == ([1.0], 0)
    _wait_dead(pids)
    assert set(verifier.worker_pids()).isdisjoint(pids)


def test_row_sent_to_a_dying_worker_is_resent():
    import os
    import signal

    with MathVerifier(workers=1, timeout_s=TIMEOUT) as v:
        v.score([r"\boxed{1}"], ["2"])  # start the worker
        (pid,) = v.worker_pids()
        os.kill(pid, signal.SIGSTOP)  # alive and "ready", but will never read its next row
        killer = threading.Timer(0.3, os.kill, args=(pid, signal.SIGKILL))
        killer.start()
        try:
            assert v.score([r"\boxed{3/6}"], ["0.5"]) == ([1.0], 0)
        finally:
            killer.join()
        assert pid not in v.worker_pids()


def test_worker_start_up_is_not_charged_to_the_row():
    # Budget far below a worker's start-up (imports + warm-up): the row still gets all of it.
    with MathVerifier(workers=1, timeout_s=0.5) as v:
        assert v.score([r"\boxed{3/6}", r"\boxed{\frac{2}{8}}"], ["0.5", "0.25"]) == ([1.0, 1.0], 0)


def test_verifiers_do_not_import_lightning():
    import subprocess
    import sys

    code = (
        "import sys, rlvr_lightning.grading; print([m for m in ('lightning', 'pytorch_lightning') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"

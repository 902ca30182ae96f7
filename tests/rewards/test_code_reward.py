"""CodeExecutionReward: fraction of tests passed; hostile programs score 0, leave the host unchanged, and the
batch goes on."""

from __future__ import annotations

import json
import os
import time

import pytest

from rlvr_lightning.grading.sandbox import SandboxUnavailable, sandbox_capabilities
from rlvr_lightning.rewards import code as code_reward
from rlvr_lightning.rewards.code import CodeExecutionReward, parse_tests
from tests.rewards.test_math_reward import make_rollout

TIMEOUT = 3.0  # per program: generous for an honest one on a loaded machine
needs_sandbox = pytest.mark.skipif(
    not sandbox_capabilities()["network_isolated"],
    reason="no network namespace on this host: the sandbox refuses to run",
)

IO_TESTS = [{"input": "2", "output": "4"}, {"input": "5", "output": "10"}]
ASSERT_TESTS = ["assert double(2) == 4", "assert double(-1) == -2"]


def fenced(program: str) -> str:
    return f"Here is my solution:\n```python\n{program}\n```\nDone."


def test_parse_tests():
    assert parse_tests(IO_TESTS) == IO_TESTS
    assert parse_tests(json.dumps(ASSERT_TESTS)) == ASSERT_TESTS
    assert parse_tests({"inputs": ["1", "2"], "outputs": ["2", "4"]}) == [
        {"input": "1", "output": "2"},
        {"input": "2", "output": "4"},
    ]
    with pytest.raises(ValueError):
        parse_tests(42)


@needs_sandbox
def test_fraction_of_tests_passed():
    texts = [
        fenced("n = int(input())\nprint(2 * n)"),  # 2/2
        fenced("n = int(input())\nprint(4)"),  # 1/2
        "I cannot write code.",  # no program: 0
        fenced("def double(x):\n    return 2 * x"),  # assertion tests: 2/2
        fenced("def double(x):\n    return x + 2"),  # 1/2
    ]
    metadata = [{"tests": IO_TESTS}] * 3 + [{"tests": json.dumps(ASSERT_TESTS)}] * 2
    reward = CodeExecutionReward(timeout_s=TIMEOUT)
    rollout = make_rollout(texts, metadata)
    scores = reward(rollout)
    assert scores.tolist() == [1.0, 0.5, 0.0, 1.0, 0.5]
    assert reward.is_correct(rollout, scores).tolist() == [True, False, False, True, False]
    assert reward.pop_errors() == 0
    assert reward.last_errors[0] is None and "wrong answer" in reward.last_errors[1]
    # what SDPO's teacher may be shown: each failed response's first failure, nothing for those that passed
    feedback = reward.feedback(rollout, scores)
    assert feedback[0] is None and feedback[3] is None
    assert feedback[1] == reward.last_errors[1] and "wrong answer" in feedback[1]
    assert feedback[2] and feedback[4]


HOSTILE = {
    "infinite loop": "while True:\n    pass",
    "sleep": "import time\ntime.sleep(1000)",
    "fork bomb": "import os\nwhile True:\n    os.fork()",
    "memory hog": "xs = []\nwhile True:\n    xs.append(' ' * 10**7)",
    "write outside": "open({path!r}, 'w').write('pwned')",
    "shell": "import os\nos.system('touch {path}')",
    "network": "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)\nprint(2 * int(input()))",
    "exit early": "import sys\nsys.exit(0)",
}


@needs_sandbox
def test_hostile_programs_score_zero_leave_the_host_unchanged_and_the_batch_goes_on(tmp_path):
    canary = tmp_path / "canary"
    hostile = [
        fenced(p.replace("{path!r}", repr(str(canary))).replace("{path}", str(canary))) for p in HOSTILE.values()
    ]
    good = fenced("n = int(input())\nprint(2 * n)")
    texts = [good, *hostile, good.replace("2 * n", "n + n")]
    reward = CodeExecutionReward(timeout_s=TIMEOUT, max_concurrency=2)
    before = set(os.listdir(tmp_path))
    t0 = time.monotonic()
    scores = reward(make_rollout(texts, [{"tests": IO_TESTS}] * len(texts)))
    elapsed = time.monotonic() - t0
    assert scores.tolist() == [1.0] + [0.0] * len(HOSTILE) + [1.0], dict(
        zip(HOSTILE, scores[1:].tolist(), strict=False)
    )
    assert not canary.exists() and set(os.listdir(tmp_path)) == before
    assert reward.pop_errors() == 0  # a hostile program is a failed test, not a reward error
    # each hanging program costs about one timeout (not one per test); two run at a time
    assert elapsed < 4 * (TIMEOUT + 4.5)
    # and the reward still works afterwards
    assert reward(make_rollout([good], [{"tests": IO_TESTS}])).tolist() == [1.0]


@needs_sandbox
def test_identical_programs_run_once(monkeypatch):
    calls = []
    real = code_reward.run_python_tests

    def counting(program, tests, **kwargs):
        calls.append(program)
        return real(program, tests, **kwargs)

    monkeypatch.setattr(code_reward, "run_python_tests", counting)
    good = fenced("n = int(input())\nprint(2 * n)")
    other = fenced("n = int(input())\nprint(n * 2)")
    reward = CodeExecutionReward(timeout_s=TIMEOUT)
    scores = reward(make_rollout([good, other, good, good], [{"tests": IO_TESTS}] * 4))
    assert scores.tolist() == [1.0] * 4
    assert len(calls) == 2


def test_bad_test_metadata_costs_only_its_row(monkeypatch):
    monkeypatch.setattr(code_reward, "run_python_tests", lambda program, tests, **kw: _Result(len(tests), len(tests)))
    reward = CodeExecutionReward(allow_network_unisolated=True)
    rollout = make_rollout([fenced("print(1)")] * 3, [{"tests": IO_TESTS}, {"tests": "not json"}, {"tests": IO_TESTS}])
    assert reward(rollout).tolist() == [1.0, 0.0, 1.0]
    assert reward.pop_errors() == 1 and "JSONDecodeError" in reward.last_errors[1]
    # a missing key is a configuration error: the whole batch scores 0, counted
    assert reward(make_rollout(["x", "y"], [{}, {}])).tolist() == [0.0, 0.0] and reward.pop_errors() == 2


def test_no_isolation_stops_the_run_whatever_on_error_says(monkeypatch):
    import rlvr_lightning.grading.sandbox as sandbox

    monkeypatch.setattr(
        sandbox, "sandbox_capabilities", lambda refresh=False: {"network_isolated": False, "errors": ["no netns"]}
    )
    with pytest.raises(SandboxUnavailable, match="allow_network_unisolated"):
        CodeExecutionReward(on_error="zero")(make_rollout([fenced("print(1)")], [{"tests": IO_TESTS}]))


class _Result:
    def __init__(self, passed, total):
        self.passed, self.total, self.error = passed, total, None

    @property
    def reward(self):
        return self.passed / self.total


@needs_sandbox
def test_the_hostile_set_through_the_reward_scores_zero_and_the_run_goes_on():
    from tests.grading.test_sandbox_hostile import ADD_TESTS, CTYPES, FORGERIES, HONEST_ADD, PARENT_KILLERS

    hostile = {**FORGERIES, **PARENT_KILLERS, **CTYPES, **{k: v for k, v in HOSTILE.items() if "{path" not in v}}
    texts = [fenced(HONEST_ADD), *[fenced(p) for p in hostile.values()], fenced(HONEST_ADD.replace("a + b", "b + a"))]
    reward = CodeExecutionReward(timeout_s=TIMEOUT, max_concurrency=2)
    scores = reward(make_rollout(texts, [{"tests": ADD_TESTS}] * len(texts)))
    assert scores.tolist() == [1.0] + [0.0] * len(hostile) + [1.0], dict(
        zip(hostile, scores[1:].tolist(), strict=False)
    )
    assert reward.pop_errors() == 0
    assert reward(make_rollout([fenced(HONEST_ADD)], [{"tests": ADD_TESTS}])).tolist() == [
        1.0
    ]  # still alive and working

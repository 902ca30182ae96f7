"""Splitting an assertion test into what the program evaluates and what the judge checks."""

from __future__ import annotations

import pytest

from rlvr_lightning.grading.assertion_tests import UnsupportedTest, parse_probe_line, split_assertion


@pytest.mark.parametrize(
    "source, imports, probes, checks",
    [
        ("assert add(2, 3) == 5", [], ["add(2, 3)"], ["_rlvr_v0 == 5"]),
        (
            "import math\nassert math.isclose(area(2), 12.56)",
            ["import math"],
            ["area(2)"],
            ["math.isclose(_rlvr_v0, 12.56)"],
        ),
        (
            "assert Solution().two_sum([1, 2], 3) == [0, 1]",
            [],
            ["Solution().two_sum([1, 2], 3)"],
            ["_rlvr_v0 == [0, 1]"],
        ),
        ("assert sorted(f(x=[3, 1])) == [1, 3]", [], ["f(x=[3, 1])"], ["sorted(_rlvr_v0) == [1, 3]"]),
        ("assert all(x > 0 for x in f(3))", [], ["f(3)"], ["all((x > 0 for x in _rlvr_v0))"]),
        ("assert f(1) == g(2)\nassert N > 0", [], ["f(1)", "g(2)", "N"], ["_rlvr_v0 == _rlvr_v1", "_rlvr_v2 > 0"]),
        (
            "from fractions import Fraction as F\nassert half() == F(1, 2)",
            ["from fractions import Fraction as F"],
            ["half()"],
            ["_rlvr_v0 == F(1, 2)"],
        ),
        ("assert abs(root(2) - math.sqrt(2)) < 1e-9", [], ["root(2)"], ["abs(_rlvr_v0 - math.sqrt(2)) < 1e-09"]),
    ],
)
def test_split(source, imports, probes, checks):
    split = split_assertion(source)
    assert (split.imports, split.probes, split.checks) == (imports, probes, checks)


@pytest.mark.parametrize(
    "source, reason",
    [
        ("assert all(f(x) == 2 * x for x in range(3))", "variable bound inside the assertion"),
        ("assert (lambda y: f(y))(2) == 4", "variable bound inside the assertion"),
        ("x = f(2)\nassert x == 4", "only import and assert statements"),
        ("def check(c):\n    assert c(2) == 4\ncheck(f)", "only import and assert statements"),
        ("import math", "no assert statement"),
        ("assert f(2) ==", "not valid Python"),
        ("assert _rlvr_v0 == 1", "reserved"),
    ],
)
def test_unsupported_tests_are_refused(source, reason):
    with pytest.raises(UnsupportedTest, match=reason):
        split_assertion(source)


def test_probe_line_is_the_last_one_with_the_nonce():
    out = 'hello\nN[1]\nworld\nN[["ok", true]]\n'
    assert parse_probe_line(out, "N") == '[["ok", true]]'
    assert parse_probe_line("no values\n", "N") is None

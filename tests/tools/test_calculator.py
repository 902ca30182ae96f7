"""The calculator: hand-computed values, precedence, exact fractions, and bounded, eval-free parsing."""

from __future__ import annotations

from fractions import Fraction

import pytest

from rlvr_lightning.tools import Calculator, ToolError
from rlvr_lightning.tools.calculator import format_number


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("2+3*4", "14"),  # * before +
        ("(2+3)*4", "20"),
        ("10-4-3", "3"),  # left-associative
        ("2^3^2", "512"),  # right-associative: 2^(3^2)
        ("-2^2", "-4"),  # the power binds tighter than the sign
        ("2**-1", "0.5"),
        ("7/2", "3.5"),
        ("1/3", "0.333333333333333"),  # 15 significant digits
        ("2/3*3", "2"),  # exact fractions, no rounding on the way
        ("0.1+0.2", "0.3"),
        ("-7 % 3", "2"),  # the divisor's sign, as Python's %
        ("1,234 + 1", "1235"),
        ("12 x 7", "84"),
        ("12 × 7 ÷ 4", "21"),
        ("347 * 28 =", "9716"),  # a trailing "=" is allowed
        (" .5 + 3. ", "3.5"),
    ],
)
def test_values(expression, value):
    assert Calculator().run(expression) == value


def test_json_arguments():
    assert Calculator().run({"expression": "6*7"}) == "42"


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("1/0", "division by zero"),
        ("0^-1", "division by zero"),
        ("2+", "ends too early"),
        ("(2+3", "ends too early"),
        ("2+3)", "unexpected )"),
        ("__import__('os').system('true')", "cannot read"),
        ("1e5", "cannot read"),  # no Python literals beyond plain decimals
        ("0b101", "cannot read"),
        ("2^0.5", "exponents must be integers"),
        ("9^9^9", "exponents must be integers"),  # 9^9 = 387420489 > 64: refused before computing
        ("10^64 * 10^64", "too large"),
        ("(" * 40 + "1" + ")" * 40, "nested parentheses"),
        ("1+" * 150 + "1", "longer than 200"),
        ("", "empty"),
    ],
)
def test_errors_name_the_problem(expression, message):
    with pytest.raises(ToolError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Calculator().run(expression)


def test_format_number():
    assert format_number(Fraction(-5, 1)) == "-5"
    assert format_number(Fraction(1, 8)) == "0.125"
    assert format_number(Fraction(1, 10**7)) == "0.0000001"  # fixed point, no exponent

"""The calculator: hand-computed values, precedence, exact fractions, and bounded, eval-free parsing."""

from __future__ import annotations

import re
import sys
from fractions import Fraction

import pytest

from rlvr_lightning.tools import Calculator, ToolError
from rlvr_lightning.tools.calculator import MAX_DEPTH, format_number


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


def test_no_value_beyond_max_digits_even_one_written_in_the_expression():
    with pytest.raises(ToolError, match="too large"):
        Calculator().run("9" * 151)  # max_digits=100: no value beyond 10^100
    with pytest.raises(ToolError, match="too large"):
        Calculator().run("0." + "0" * 120 + "1")  # its denominator is
    assert Calculator().run("9" * 100) == "9" * 100
    assert Calculator().run("1.5" + "0" * 150) == "1.5"  # trailing zeros are not digits of the value


def test_raised_limits_stay_bounded_without_recursion_errors():
    calculator = Calculator(max_chars=100_000, max_depth=MAX_DEPTH, max_digits=100)
    for expression, message in [
        ("(" * 2000 + "1" + ")" * 2000, "more than 100 nested parentheses"),
        ("2^" * 3000 + "2", "more than 100 nested exponents"),
        ("(10^50)^3", "too large"),  # refused from the sizes of base and exponent, before it is computed
        ("9" * 5000, "too large"),  # never converted (Python refuses integers of over 4,300 digits)
    ]:
        with pytest.raises(ToolError, match=message):
            calculator.run(expression)
    assert calculator.run("-" * 50_000 + "1") == "1"  # signs are read in a loop
    assert calculator.run("(" * 100 + "1" + ")" * 100) == "1"
    assert calculator.run("(10^50)^2") == "1" + "0" * 100  # exactly 10^100: allowed

    def deep(frames: int) -> str:  # a caller whose own stack is nearly full
        return deep(frames - 1) if frames else calculator.run("(" * 100 + "1" + ")" * 100)

    with pytest.raises(ToolError, match="nested too deeply"):
        deep(sys.getrecursionlimit() - 300)


@pytest.mark.parametrize(
    ("option", "value", "valid"),
    [("max_depth", 10_000, "[1, 100]"), ("max_digits", 5000, "[1, 1000]"), ("max_chars", 0, ">= 1")],
)
def test_limits_beyond_what_the_parser_can_bound_are_refused(option, value, valid):
    with pytest.raises(ValueError) as refused:
        Calculator(**{option: value})
    expected = rf"{option}={value} is not valid: must be an integer (in )?{re.escape(valid)}"
    assert re.fullmatch(expected, str(refused.value))

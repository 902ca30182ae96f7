"""`Calculator`: exact arithmetic on an expression written by the model, parsed by hand (never `eval`).

Grammar (usual precedence; `^` and `**` bind tighter than a unary sign, and to the right: -2^2 = -4):

    expression := term (("+" | "-") term)*
    term       := unary (("*" | "/" | "%" | "x" | "×" | "÷") unary)*
    unary      := ("+" | "-") unary | power
    power      := atom (("^" | "**") unary)?
    atom       := number | "(" expression ")"

Numbers are decimals (`12`, `3.5`, `.5`); thousands separators (`1,000`) are accepted when every group
has three digits. Values are exact fractions: `7/2` gives `3.5`, `1/3` gives `0.333333333333333`
(15 significant digits). Bounded work: at most `max_chars` characters and `max_depth` nested
parentheses or exponents, integer exponents up to 64 in magnitude, and no value (a number written in the
expression, an intermediate or the result) beyond 10^`max_digits`; a power is refused from the sizes of its
base and exponent before it is computed. The limits are bounded themselves (their declared domains): the parser
recurses once per level of nesting (a few frames each), and Python converts at most 4,300 digits to an
integer.
"""

from __future__ import annotations

import re
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Annotated, Any

from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import Range
from rlvr_lightning.tools.base import Tool, ToolError

_TOKEN = re.compile(r"\s*(?:(\d{1,3}(?:,\d{3})+(?:\.\d*)?|\d+\.?\d*|\.\d+)|(\*\*|[-+*/%^()x×÷]))")
_MAX_EXPONENT = 64
MAX_DEPTH = 100  # 5 frames a level: 500 of Python's 1,000, the rest left to the caller
MAX_DIGITS = 1000
_LOG2_10 = 3.3219280948873626


@documented_options
class Calculator(Tool):
    default_name = "calculator"

    def __init__(
        self,
        name: str | None = None,
        max_chars: Annotated[int, Option("the longest expression, in characters.", Range(1, integer=True))] = 200,
        max_depth: Annotated[
            int, Option("the deepest nesting of parentheses or exponents.", Range(1, MAX_DEPTH, integer=True))
        ] = 32,
        max_digits: Annotated[int, Option("no value beyond 10^max_digits.", Range(1, MAX_DIGITS, integer=True))] = 100,
    ) -> None:
        check_options(Calculator, locals())
        super().__init__(name)
        self.max_chars = max_chars
        self.max_depth = max_depth
        self.max_digits = max_digits

    def run(self, arguments: str | dict[str, Any]) -> str:
        return format_number(self.evaluate(self.text_argument(arguments, "expression")))

    def evaluate(self, expression: str) -> Fraction:
        text = expression.strip().rstrip("=").strip()
        if not text:
            raise ToolError("empty expression")
        if len(text) > self.max_chars:
            raise ToolError(f"expression longer than {self.max_chars} characters")
        try:
            return _Parser(_tokens(text, self.max_digits), self.max_depth, self.max_digits).parse()
        except RecursionError:  # the caller's own stack was already deep
            raise ToolError("the expression is nested too deeply") from None


def _tokens(text: str, max_digits: int) -> list[str | Fraction]:
    tokens: list[str | Fraction] = []
    position = 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            if text[position:].strip() == "":
                break
            raise ToolError(f"cannot read {text[position : position + 10]!r} at character {position}")
        number, operator = match.groups()
        tokens.append(_number(number, max_digits) if number is not None else operator)
        position = match.end()
    return tokens


def _number(literal: str, max_digits: int) -> Fraction:
    """A decimal literal as a fraction; one with more than `max_digits` significant digits in its whole part or
    its decimals is too large (beyond 10^max_digits, or a denominator that is) and is never converted."""
    whole, _, decimals = literal.replace(",", "").partition(".")
    if len(whole.lstrip("0")) > max_digits or len(decimals.rstrip("0")) > max_digits:
        raise ToolError("a value is too large")
    return Fraction(f"{whole or '0'}.{decimals.rstrip('0') or '0'}")


class _Parser:
    """Recursive descent over the tokens (see the module docstring for the grammar)."""

    def __init__(self, tokens: list[str | Fraction], max_depth: int, max_digits: int) -> None:
        self.tokens, self.position, self.depth = tokens, 0, 0
        self.max_depth, self.limit = max_depth, Fraction(10) ** max_digits
        self.limit_bits = max_digits * _LOG2_10

    def parse(self) -> Fraction:
        value = self.expression()
        if self.position != len(self.tokens):
            raise ToolError(f"unexpected {self.tokens[self.position]!s} after a complete expression")
        return value

    def peek(self) -> str | Fraction | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self) -> str | Fraction:
        token = self.peek()
        if token is None:
            raise ToolError("the expression ends too early")
        self.position += 1
        return token

    def checked(self, value: Fraction) -> Fraction:
        if abs(value.numerator) > self.limit * value.denominator or value.denominator > self.limit:
            raise ToolError("a value is too large")
        return value

    def expression(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            operator, right = self.take(), self.term()
            value = self.checked(value + right if operator == "+" else value - right)
        return value

    def term(self) -> Fraction:
        value = self.unary()
        while self.peek() in ("*", "/", "%", "x", "×", "÷"):
            operator, right = self.take(), self.unary()
            if operator in ("/", "÷", "%") and right == 0:
                raise ToolError("division by zero")
            if operator in ("*", "x", "×"):
                value = value * right
            elif operator == "%":
                value = value - right * (value // right)  # the sign of the divisor, as Python's %
            else:
                value = value / right
            value = self.checked(value)
        return value

    def unary(self) -> Fraction:
        negative = False
        while self.peek() in ("+", "-"):  # a loop, not a recursion: "------1" costs no stack
            negative ^= self.take() == "-"
        value = self.power()
        return -value if negative else value

    def power(self) -> Fraction:
        base = self.atom()
        if self.peek() not in ("^", "**"):
            return base
        self.take()
        self.enter("exponents")
        exponent = self.unary()
        self.depth -= 1
        if exponent.denominator != 1 or abs(exponent) > _MAX_EXPONENT:
            raise ToolError(f"exponents must be integers of at most {_MAX_EXPONENT} in magnitude")
        if base == 0 and exponent < 0:
            raise ToolError("division by zero")
        bits = max(abs(base.numerator).bit_length(), base.denominator.bit_length()) - 1  # <= log2 of the larger
        if bits * abs(int(exponent)) > self.limit_bits:  # refused before the power is computed
            raise ToolError("a value is too large")
        return self.checked(base ** int(exponent))

    def atom(self) -> Fraction:
        token = self.take()
        if isinstance(token, Fraction):
            return self.checked(token)
        if token != "(":
            raise ToolError(f"unexpected {token!s}")
        self.enter("parentheses")
        value = self.expression()
        if self.take() != ")":
            raise ToolError("a parenthesis is not closed")
        self.depth -= 1
        return value

    def enter(self, what: str) -> None:
        """One level deeper (parentheses and exponents share the count): each costs a few stack frames."""
        self.depth += 1
        if self.depth > self.max_depth:
            raise ToolError(f"more than {self.max_depth} nested {what}")


def format_number(value: Fraction) -> str:
    """An integer as is; anything else as a decimal with at most 15 significant digits."""
    if value.denominator == 1:
        return str(value.numerator)
    with localcontext() as context:
        context.prec = 15
        return format((Decimal(value.numerator) / Decimal(value.denominator)).normalize(), "f")

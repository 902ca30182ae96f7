"""The domain of a numeric option, and the check that a value lies in it.

    check_range("group_size", 0, low=1, integer=True)
    ValueError: group_size=0 is not valid: must be an integer >= 1

A class declares each option's domain beside the option, `Annotated[int, Option(help, POSITIVE_INT)]`
(`runtime/option_declarations.py`), and checks it first thing in `__init__`; `rlvr` checks the same
declarations on the parsed config before any class is built (`cli/errors/early_checks.py`), so a bad value stops
a run before a model loads. A float must be finite: NaN or infinity is never a valid option value. `OneOf` is the
domain of an option that names one of a few choices, `InputFile` of one that names a file to read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


class OptionValueError(ValueError):
    """A value outside its option's domain: the message starts with `option=value`."""

    def __init__(self, option: str, value: Any, must_be: str, message: str | None = None) -> None:
        self.option, self.value = option, value
        super().__init__(message or f"{option}={value!r} is not valid: must be {must_be}")


@dataclass(frozen=True)
class Range:
    """Numbers from `low` to `high` (None: unbounded), each end included unless `low_open` / `high_open`;
    `integer`: whole numbers only; `optional`: None (null in YAML) allowed too."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    optional: bool = False

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        if self.low is not None and self.high is not None:
            text = f"{kind} in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"
        elif self.low is not None:
            text = f"{kind} {'>' if self.low_open else '>='} {self.low}"
        elif self.high is not None:
            text = f"{kind} {'<' if self.high_open else '<='} {self.high}"
        else:
            text = kind
        return text + (" (or null)" if self.optional else "")

    def contains(self, value: Any) -> bool:
        if value is None:
            return self.optional
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.integer and not (isinstance(value, int) or (math.isfinite(value) and value == int(value))):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))

    def check(self, option: str, value: Any) -> None:
        if not self.contains(value):
            raise OptionValueError(option, value, self.describe())


@dataclass(frozen=True)
class OneOf:
    """One of `choices` (`optional`: or None)."""

    choices: tuple[Any, ...]
    optional: bool = False

    def describe(self) -> str:
        return f"one of {list(self.choices)}" + (" (or null)" if self.optional else "")

    def contains(self, value: Any) -> bool:
        return (value is None and self.optional) or (value is not None and value in self.choices)

    def check(self, option: str, value: Any) -> None:
        if not self.contains(value):
            message = f"{option}={value!r} is not valid; choose one of {list(self.choices)}"
            raise OptionValueError(option, value, self.describe(), message)


@dataclass(frozen=True)
class Placeholders:
    """A string template that contains each of `names` (e.g. "{prompt}"; `any_of`: one of them at least; `optional`:
    or None)."""

    names: tuple[str, ...]
    optional: bool = False
    any_of: bool = False

    def describe(self) -> str:
        names = (" or " if self.any_of else " and ").join(self.names)
        return "a string containing " + names + (" (or null)" if self.optional else "")

    def contains(self, value: Any) -> bool:
        if value is None:
            return self.optional
        found = (name in value for name in self.names) if isinstance(value, str) else iter([False])
        return any(found) if self.any_of else all(found)

    def check(self, option: str, value: Any) -> None:
        if not self.contains(value):
            raise OptionValueError(option, value, self.describe())


class InputFileError(OptionValueError, FileNotFoundError):
    """An input file option that names no file (or a directory): the message says where it was looked for."""


@dataclass(frozen=True)
class InputFile:
    """The path of an existing file (`optional`: or None), checked with the parsed config before any class is
    built, so a mistyped data file stops a run before a model loads."""

    optional: bool = False

    def describe(self) -> str:
        return "an existing file" + (" (or null)" if self.optional else "")

    def check(self, option: str, value: Any) -> None:
        from rlvr_lightning.runtime.config_locations import check_input_file

        if value is None:
            if self.optional:
                return
            raise InputFileError(option, value, self.describe())
        try:
            check_input_file(value, option)
        except (OSError, TypeError) as error:
            raise InputFileError(option, value, self.describe(), str(error)) from None


def check_range(
    option: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    integer: bool = False,
    optional: bool = False,
) -> None:
    """Raise `OptionValueError` (a ValueError naming the option, the value and the valid range) unless `value`
    lies in the `Range` these arguments describe."""
    Range(low, high, low_open, high_open, integer, optional).check(option, value)


def is_finite_number(value: Any) -> bool:
    """False only for a float that is NaN or infinite."""
    return not isinstance(value, float) or math.isfinite(value)


# shorthands for the common domains
POSITIVE_INT = Range(1, integer=True)
NON_NEGATIVE_INT = Range(0, integer=True)
POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
FINITE = Range()
PROBABILITY = Range(0, 1)

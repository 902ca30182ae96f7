"""Options that take an object or the name of a built-in class (``loss: ppo_clip``, ``kl.estimator: k3``)."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def from_shorthand(value: T | str, base: type[T], shorthands: dict[str, type[T]], option: str, example: str) -> T:
    """``value`` itself when it is a ``base``, else the built-in class the shorthand ``value`` names, built with
    its defaults. A wrong value names the option, the value and the choices (``example``: a class_path to show)."""
    if isinstance(value, base):
        return value
    if isinstance(value, str) and value in shorthands:
        return shorthands[value]()
    raise ValueError(
        f"{option}={value!r} is not valid; choose one of {list(shorthands)} or a {base.__name__} "
        f"(class_path: {example})"
    )

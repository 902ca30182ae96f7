"""An option's help and domain, declared with its type where the option is declared.

    @documented_options
    @dataclass(frozen=True)
    class UpdateConfig:
        epochs: Annotated[int, Option("passes over the rollout (PPO epochs)", POSITIVE_INT)] = 1

    class RLVRModule:
        def __init__(self, group_size: Annotated[int, Option("responses sampled per prompt", POSITIVE_INT)] = 8):
            check_options(RLVRModule, locals())

The same declaration serves a dataclass field (an option group) and an `__init__` argument (a class configured
by `class_path` and `init_args`), as prime-rl declares `Annotated[int, Field(ge=1, description=...)]`:

* `check_options` checks the values against their domains (first thing in `__init__`, or in `__post_init__`);
  `rlvr` checks the parsed config against the same declarations before any class is built
  (`cli/errors/early_checks.py`);
* `documented_options` writes the helps into the `Args:` of the class docstring (a dataclass) or of its
  `__init__`, where jsonargparse (`rlvr --help`) reads an option's description.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlvr_lightning.runtime.option_domains import InputFile, OneOf, Placeholders, Range


@dataclass(frozen=True)
class Option:
    """What an option means (`help`, shown by `--help`) and the values it may take (`domain`; None: any value
    its type allows)."""

    help: str
    domain: Range | OneOf | InputFile | Placeholders | None = None


@functools.cache
def declared_options(owner: type) -> dict[str, Option]:
    """The options `owner` declares with `Annotated[type, Option(...)]`: its fields if it is a dataclass, else the
    arguments of its `__init__` and of its bases' (a subclass's declaration wins). Its own annotations must
    resolve (a NameError here is a declaration to fix)."""
    if dataclasses.is_dataclass(owner):
        sources: list[Any] = [owner]
    else:
        sources = [klass.__init__ for klass in reversed(owner.__mro__) if "__init__" in vars(klass)]
    options: dict[str, Option] = {}
    for source in sources:
        try:
            hints = typing.get_type_hints(source, include_extras=True)
        except Exception:  # a base whose annotations do not resolve declares nothing we know of; `owner` must
            if source is sources[-1]:
                raise
            continue
        for name, hint in hints.items():
            declared = [item for item in getattr(hint, "__metadata__", ()) if isinstance(item, Option)]
            if declared:
                options[name] = declared[0]
    return options


def declared_domains(owner: type) -> dict[str, Range | OneOf | InputFile | Placeholders]:
    """The domains among `owner`'s declared options."""
    return {name: option.domain for name, option in declared_options(owner).items() if option.domain is not None}


def check_options(owner: type, values: Mapping[str, Any], prefix: str = "") -> None:
    """Raise `OptionValueError` (naming the option as `prefix + name`, the value and its domain) for the first of
    `values` (e.g. `locals()` in `__init__`, `vars(self)` in `__post_init__`) outside its declared domain."""
    for name, domain in declared_domains(owner).items():
        if name in values:
            domain.check(prefix + name, values[name])


def documented_options(owner: type) -> type:
    """Class decorator: add the help of each option `owner` declares to the `Args:` section of the docstring that
    documents them: the class's for a dataclass, else its `__init__`'s (one is added if it has none)."""
    lines = [f"    {name}: {option.help}" for name, option in declared_options(owner).items()]
    target = owner if dataclasses.is_dataclass(owner) else vars(owner).get("__init__")
    if not lines or target is None:
        return owner
    doc = inspect.cleandoc(target.__doc__ or "")
    if re.search(r"^Args:$", doc, flags=re.MULTILINE):
        doc = re.sub(r"^Args:$", lambda match: "\n".join(["Args:", *lines]), doc, count=1, flags=re.MULTILINE)
    else:
        doc = "\n".join([doc, "", "Args:", *lines]).strip()
    target.__doc__ = "\n" + doc if doc.startswith("Args:") else doc  # a first line is the short description
    return owner

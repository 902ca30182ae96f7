"""`ConfigProblem`, the few lines `rlvr` prints for a configuration mistake, and the look-ups that fill in
its valid choices, its "did you mean" and its tip: the options a configured class accepts."""

from __future__ import annotations

import ast
import difflib
import importlib
import re
from dataclasses import dataclass, field
from typing import Any

DEBUG_HINT = "run again with --debug (or RLVR_DEBUG=1) for the full message and traceback"
HELP_TIPS = {
    "model": "the module's options, with their help: rlvr fit --model.help {class_path}",
    "data": "the data module's options, with their help: rlvr fit --data.help {class_path}",
}


@dataclass
class ConfigProblem:
    what: str  # what is wrong, one line
    option: str | None = None  # dotted option path
    where: str | None = None  # "file:line" or "command line: --x=y"
    choices: list[str] = field(default_factory=list)
    suggestion: str | None = None
    tip: str | None = None

    def render(self) -> str:
        lines = [f"error: {self.what}"]
        if self.option or self.where:
            place = f"{self.option} ({self.where})" if self.option and self.where else self.option or self.where
            lines.append(f"  at {place}")
        if self.suggestion:
            lines.append(f"  did you mean {self.suggestion!r}?")
        if self.choices:
            shown = ", ".join(self.choices[:40]) + (", ..." if len(self.choices) > 40 else "")
            lines.append(f"  valid: {shown}")
        if self.tip:
            lines.append(f"  {self.tip}")
        lines.append(f"  ({DEBUG_HINT})")
        return "\n".join(lines)


def closest(value: str, choices: list[str]) -> str | None:
    matches = difflib.get_close_matches(value, choices, n=1, cutoff=0.6)
    return matches[0] if matches else None


def import_class(class_path: str) -> Any:
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def init_options(class_path: str) -> list[str]:
    """The options (`init_args`) a class accepts, as jsonargparse sees them."""
    from jsonargparse._parameter_resolvers import get_signature_parameters

    try:
        return sorted(p.name for p in get_signature_parameters(import_class(class_path), "__init__"))
    except Exception:  # noqa: BLE001 - only a suggestion is lost
        return []


def group_fields(class_path: str, group: str) -> list[str]:
    """The fields of the option group (a dataclass) `group` of class `class_path`'s constructor."""
    import dataclasses
    import typing

    try:
        for cls in import_class(class_path).__mro__:
            hints = typing.get_type_hints(cls.__init__) if "__init__" in vars(cls) else {}
            for kind in (hints.get(group), *typing.get_args(hints.get(group))):
                if dataclasses.is_dataclass(kind):
                    return sorted(field.name for field in dataclasses.fields(kind))
    except Exception:  # noqa: BLE001 - only a suggestion is lost
        pass
    return []


def help_tip(section: str | None, class_path: str | None) -> str | None:
    """How to list the options of the module or data module (`section` "model" or "data") of class `class_path`."""
    if class_path and section in HELP_TIPS:
        return HELP_TIPS[section].format(class_path=class_path)
    return None


def choices_in(text: str) -> tuple[list[str], str | None]:
    """The valid choices a message lists (`[...]` or `(...)` of quoted strings) and the closest to its quoted value."""
    listed = re.search(r"[\[(]\s*('[^']*'(?:\s*,\s*'[^']*')*)\s*,?\s*[\])]", text)
    if not listed:
        return [], None
    try:
        choices = [str(c) for c in ast.literal_eval(f"[{listed.group(1)}]")]
    except (ValueError, SyntaxError):
        return [], None
    given = re.search(r"(?:=|\b[\w.]+ )'([^']*)'", text[: listed.start()])
    if not given or "did you mean" in text:
        return choices, None
    return choices, closest(given.group(1), choices)


def config_path_of(obj: Any, config: Any) -> tuple[str | None, str | None]:
    """(dotted option path, class_path) of the config section that built `obj` (matched by class)."""
    if config is None or obj is None:
        return None, None
    tree = config.as_dict() if hasattr(config, "as_dict") else config
    cls = type(obj)

    def walk(node: Any, path: list[str]):
        if isinstance(node, dict):
            class_path = node.get("class_path")
            if isinstance(class_path, str):
                try:
                    if import_class(class_path) is cls:
                        return ".".join(path), class_path
                except Exception:  # noqa: BLE001
                    pass
            for key, value in node.items():
                found = walk(value, [*path, str(key)])
                if found:
                    return found
        elif isinstance(node, list):
            for i, value in enumerate(node):
                found = walk(value, [*path[:-1], f"{path[-1]}[{i}]"] if path else [str(i)])
                if found:
                    return found
        return None

    return walk(tree, []) or (None, None)


def option_type(class_path: str, key: str) -> Any:
    """The annotation of option `key` of class `class_path` (`generation.backend`: the field of an option group),
    None where it cannot be found."""
    import dataclasses
    import typing

    first, *rest = key.split(".")
    try:
        hint = None
        for cls in import_class(class_path).__mro__:
            if "__init__" in vars(cls) and first in (hints := typing.get_type_hints(cls.__init__)):
                hint = hints[first]
                break
        for name in rest:
            group = next(kind for kind in (hint, *typing.get_args(hint)) if dataclasses.is_dataclass(kind))
            hint = typing.get_type_hints(group)[name]
        return hint
    except Exception:  # noqa: BLE001 - only a suggestion is lost
        return None


def subclass_names(class_path: str, key: str) -> list[str]:
    """The names of the classes option `key` of class `class_path` accepts: the concrete subclasses (imported so
    far, as jsonargparse resolves a bare class name) of the classes its annotation names."""
    import typing

    hint = option_type(class_path, key)
    return _concrete_subclasses([kind for kind in (hint, *typing.get_args(hint)) if isinstance(kind, type)])


def subclasses_of(dotted: list[str]) -> list[str]:
    """The names of the concrete subclasses (imported so far) of the classes named `dotted` (those that import)."""
    bases = []
    for name in dotted:
        try:
            bases.append(import_class(name))
        except Exception:  # noqa: BLE001 - a builtin or a name that does not import: no subclasses to list
            continue
    return _concrete_subclasses([base for base in bases if isinstance(base, type)])


def _concrete_subclasses(bases: list[type]) -> list[str]:
    import inspect

    bases = [base for base in bases if base not in (str, int, float, bool, type(None))]
    found: set[str] = set()
    while bases:
        cls = bases.pop()
        if not inspect.isabstract(cls) and not cls.__name__.startswith("_"):
            found.add(cls.__name__)
        bases.extend(cls.__subclasses__())
    return sorted(found)

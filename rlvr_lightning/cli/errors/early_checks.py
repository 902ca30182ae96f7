"""The options' domains, checked on the parsed config before any configured class is built.

jsonargparse builds the innermost classes first: a module's policy (which loads its model) before the module
whose `group_size` is 0. `check_options_early` checks every section of the config that names a class of ours
or a torch optimizer (`class_path`) before anything is built:

* the domains the class declares beside its options (`Annotated[int, Option(help, domain)]`,
  `rlvr_lightning.runtime.option_declarations`) against the section's `init_args`;
* its option groups (frozen dataclasses: `update: {epochs: 0}`), built from their values, so they check
  themselves;
* a torch optimizer's `lr`, `weight_decay`, `eps` and `momentum`: finite and >= 0;
* no NaN or infinite number anywhere in those sections.

A value out of its domain raises `EarlyOptionError`, a ValueError that carries the option's full path.
`check_eval_options` checks `rlvr eval`'s options (`--eval.*`) against each other and the config's validation.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Mapping
from typing import Any

from rlvr_lightning.cli.errors.problem import import_class
from rlvr_lightning.evaluation.report import EvalOptions
from rlvr_lightning.modules.options import ValidationConfig
from rlvr_lightning.runtime.option_declarations import declared_domains
from rlvr_lightning.runtime.option_domains import (
    NON_NEGATIVE,
    OneOf,
    OptionValueError,
    Placeholders,
    Range,
    is_finite_number,
)

OPTIMIZER_RANGES = {"lr": NON_NEGATIVE, "weight_decay": NON_NEGATIVE, "eps": NON_NEGATIVE, "momentum": NON_NEGATIVE}
CHECKED_MODULES = ("rlvr_lightning.", "torch.optim.")


class EarlyOptionError(ValueError):
    """A value out of its option's domain, found before anything was built; `option` is the dotted path."""

    def __init__(self, message: str, option: str, section_class: str | None = None) -> None:
        super().__init__(message)
        self.option, self.section_class = option, section_class


def check_options_early(config: Mapping[str, Any], top_level: Mapping[str, Range] | None = None) -> None:
    """Raise `EarlyOptionError` for the first option of `config` (a parsed config as a dict) out of its domain;
    `top_level`: the domains of options outside any class (`torch_threads`)."""
    for name, domain in (top_level or {}).items():
        if name in config:
            _check(domain, name, config[name], name, None)
    for key, value in config.items():
        section_class = value.get("class_path") if isinstance(value, dict) else None
        _walk(value, str(key), section_class if isinstance(section_class, str) else None)


def check_eval_options(config: Mapping[str, Any]) -> None:
    """Raise `EarlyOptionError` when `rlvr eval`'s options (the parsed config's `eval`) are out of their domains
    or contradict each other or the config's `model.init_args.validation`."""
    validation = ((config.get("model") or {}).get("init_args") or {}).get("validation") or {}
    fields = {field.name for field in dataclasses.fields(ValidationConfig)}
    try:
        default = ValidationConfig(**{name: value for name, value in validation.items() if name in fields})
        EvalOptions(**(config.get("eval") or {})).decoding(default.group_size, default.greedy)
    except ValueError as error:
        head = re.match(r"^((?:eval|validation)\.\w+)=", str(error))
        option = head.group(1) if head else "eval"
        option = option if option.startswith("eval") else f"model.init_args.{option}"
        raise EarlyOptionError(str(error), option) from None


def _walk(node: Any, path: str, section_class: str | None) -> None:
    if isinstance(node, dict):
        class_path = node.get("class_path")
        if isinstance(class_path, str):
            _check_section(class_path, node.get("init_args") or {}, path, section_class)
        for key, value in node.items():
            _walk(value, f"{path}.{key}", section_class)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _walk(value, f"{path}[{i}]", section_class)


def _check_section(class_path: str, init_args: Mapping[str, Any], path: str, section_class: str | None) -> None:
    try:
        cls = import_class(class_path)
    except Exception:  # noqa: BLE001 - the parser has accepted it; whatever is wrong shows when it is built
        return
    if not isinstance(cls, type) or not f"{cls.__module__}.".startswith(CHECKED_MODULES):
        return
    base = f"{path}.init_args"
    if dataclasses.is_dataclass(cls):
        _build_group(cls, init_args, base, section_class, "")
        return
    ranges = declared_domains(cls)
    if _is_optimizer(cls):
        ranges = {**OPTIMIZER_RANGES, **ranges}
    for name, value in init_args.items():
        _check(ranges.get(name), name, value, f"{base}.{name}", section_class)
    for name, group in _option_groups(cls).items():
        value = init_args.get(name)
        if isinstance(value, dict) and "class_path" not in value:
            _build_group(group, value, f"{base}.{name}", section_class, f"{name}.")


def _check(
    domain: Range | OneOf | Placeholders | None, name: str, value: Any, option: str, section_class: str | None
) -> None:
    try:
        if domain is not None:
            domain.check(name, value)
        elif not is_finite_number(value):
            raise OptionValueError(name, value, "a finite number")
    except OptionValueError as error:
        raise EarlyOptionError(str(error), option, section_class) from None


def _build_group(group: type, values: Mapping[str, Any], path: str, section_class: str | None, label: str) -> None:
    """Build the option group `group` from `values` (nested class sections left to their defaults), so that it
    checks itself; its error names the field it starts with (`update.epochs=0 ...`). `label`: the group's name
    and a dot, as messages name its fields."""
    fields = {field.name for field in dataclasses.fields(group)}
    ranges = declared_domains(group)
    for name, value in values.items():
        _check(ranges.get(name), label + name, value, f"{path}.{name}", section_class)
    try:
        group(**{name: value for name, value in values.items() if name in fields and not isinstance(value, dict)})
    except (ValueError, TypeError) as error:
        text = str(error)
        head = re.match(r"^(?:\w+\.)?(\w+)\b", text)
        option = f"{path}.{head.group(1)}" if head and head.group(1) in fields else path
        raise EarlyOptionError(text, option, section_class) from None


def _option_groups(cls: type) -> dict[str, type]:
    """The constructor arguments of `cls` (and of its bases, for `**kwargs`) whose type is a dataclass."""
    groups: dict[str, type] = {}
    for klass in reversed(cls.__mro__):
        if "__init__" not in vars(klass):
            continue
        try:
            hints = typing.get_type_hints(klass.__init__)
        except Exception:  # noqa: BLE001 - a base whose annotations do not resolve has no groups we know of
            continue
        for name, hint in hints.items():
            for kind in (hint, *typing.get_args(hint)):
                if isinstance(kind, type) and dataclasses.is_dataclass(kind):
                    groups[name] = kind
    return groups


def _is_optimizer(cls: type) -> bool:
    import torch

    return issubclass(cls, torch.optim.Optimizer)

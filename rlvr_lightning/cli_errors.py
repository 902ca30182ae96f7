"""Short messages for configuration mistakes on the `rlvr` command line.

Without this, a misspelled option reaches the user as jsonargparse's 60-line usage dump followed
by a nested message, and a value a module rejects as a long traceback ending in a Namespace dump.
`explain_parse_error` and `explain_build_error` turn either into a few lines:

    error: RLVRModule has no option 'clip_hgh'
      at model.init_args.clip_hgh (my.yaml:4)
      did you mean 'clip_high'?
      valid: aggregation, clip_high, clip_low, dual_clip, ...

What is a configuration mistake (short message, exit status 2): any error of the argument parser;
a `ValueError`, `FileNotFoundError` or `ImportError` raised while the configured classes are built;
a `ValueError` raised by a `setup`, `configure_optimizers` or `on_fit_start` hook; Lightning's
`MisconfigurationException`. Everything else keeps its traceback.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import inspect
import os
import pkgutil
import re
import traceback
from argparse import ArgumentError
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr_lightning.config_locations import locate

DEBUG_HINT = "run again with --debug (or RLVR_DEBUG=1) for the full message and traceback"
HELP_TIPS = {
    "model": "the module's options, with their help: rlvr fit --model.help {class_path}",
    "data": "the data module's options, with their help: rlvr fit --data.help {class_path}",
}
SETUP_HOOKS = ("setup", "configure_optimizers", "configure_model", "on_fit_start")
# jsonargparse's structural lines, which say nothing about the mistake itself
_NOISE = re.compile(
    r"^(- )?(Does not validate against any of the Union subtypes|Subtypes:|Errors:|Given value( type)?:|"
    r"Expected a <class 'NoneType'>|Not a valid subclass of|Subclass types expect one of|a class path \(str\)|"
    r"a dict with|a dict without)"
)


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
            place = " ".join(part for part in (self.option, f"({self.where})" if self.where else None) if part)
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


# ----------------------------------------------------------------------------- parser errors


def _leaf(message: str) -> tuple[list[str], list[str], str]:
    """The innermost informative line of a jsonargparse message, with the option keys and class paths
    leading to it: (keys, classes, text)."""
    stack: list[tuple[int, str, str]] = []  # (indent, kind, name)
    for raw in message.splitlines():
        if not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip())
        text = raw.strip()
        item = text.startswith("- ")
        body = text[2:] if item else text
        if item:
            indent += 2
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = re.match(r'Parser key "([^"]+)":\s*(.*)$', body)
        if key:
            stack.append((indent, "key", key.group(1)))
            body = key.group(2)
            if not body:
                continue
        cls = re.match(r"Problem with given class_path '([^']+)':\s*(.*)$", body)
        if cls:
            stack.append((indent, "class", cls.group(1)))
            body = cls.group(2)
            if not body:
                continue
        if _NOISE.match(body):
            continue
        keys = [name for _, kind, name in stack if kind == "key"]
        classes = [name for _, kind, name in stack if kind == "class"]
        return keys, classes, body
    return [], [], message.strip().splitlines()[-1] if message.strip() else message


def _option_path(keys: list[str], classes: list[str]) -> str:
    """`model` + RLVRModule + `policy` -> `model.init_args.policy` (a key below a class is an init arg)."""
    parts: list[str] = []
    for i, key in enumerate(keys):
        if i > 0 and i - 1 < len(classes):
            parts.append("init_args")
        parts.append(key)
    return ".".join(parts)


def _import(class_path: str) -> Any:
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def init_options(class_path: str) -> list[str]:
    """The options (`init_args`) a class accepts, as jsonargparse sees them."""
    from jsonargparse._parameter_resolvers import get_signature_parameters

    try:
        return sorted(p.name for p in get_signature_parameters(_import(class_path), "__init__"))
    except Exception:  # noqa: BLE001 - only a suggestion is lost
        return []


def group_fields(class_path: str, group: str) -> list[str]:
    """The fields of the option group (a dataclass) `group` of class `class_path`'s constructor."""
    import dataclasses
    import typing

    try:
        for cls in _import(class_path).__mro__:
            hints = typing.get_type_hints(cls.__init__) if "__init__" in vars(cls) else {}
            for kind in (hints.get(group), *typing.get_args(hints.get(group))):
                if dataclasses.is_dataclass(kind):
                    return sorted(field.name for field in dataclasses.fields(kind))
    except Exception:  # noqa: BLE001 - only a suggestion is lost
        pass
    return []


def _module_members(module_path: str) -> list[str]:
    try:
        module = importlib.import_module(module_path)
    except Exception:  # noqa: BLE001
        return []
    package = module_path.split(".")[0]
    names = {
        name
        for name, value in vars(module).items()
        if inspect.isclass(value) and not name.startswith("_") and value.__module__.split(".")[0] == package
    }
    if hasattr(module, "__path__"):
        names |= {info.name for info in pkgutil.iter_modules(module.__path__) if not info.name.startswith("_")}
    return sorted(names)


def _help_tip(section: str | None, class_path: str | None) -> str | None:
    """How to list the options of the module or data module (`section` "model" or "data") of class `class_path`."""
    if class_path and section in HELP_TIPS:
        return HELP_TIPS[section].format(class_path=class_path)
    return None


def explain_parse_error(message: str, argv: list[str], parser: Any = None) -> ConfigProblem:
    """A jsonargparse error message as a `ConfigProblem`."""
    keys, classes, text = _leaf(message)
    option = _option_path(keys, classes) if keys else None
    class_path = classes[-1] if classes else None

    if m := re.search(r"Option '([\w.]+)' is not accepted", text):
        name = m.group(1)
        option = f"{option}.init_args.{name}" if option and class_path else name
        choices = init_options(class_path) if class_path else []
        owner = class_path.rpartition(".")[2] if class_path else "this section"
        return ConfigProblem(
            f"{owner} has no option {name!r}",
            option,
            locate(option, argv),
            choices,
            closest(name, choices),
            _help_tip(keys[0] if len(keys) == 1 and len(classes) == 1 else None, class_path),
        )
    if (m := re.search(r"Group '([\w.]+)' does not accept option '(\w+)'", text)) and class_path:
        group, name = m.groups()
        option = f"{option}.init_args.{group}.{name}" if option else f"{group}.{name}"
        choices = group_fields(class_path, group)
        return ConfigProblem(
            f"{group} has no option {name!r}",
            option,
            locate(option, argv),
            choices,
            closest(name, choices),
            _help_tip(keys[0] if len(keys) == 1 and len(classes) == 1 else None, class_path),
        )
    if m := re.search(r"module '([\w.]+)' has no attribute '(\w+)'", text):
        module, name = m.groups()
        choices = _module_members(module)
        wrong = f"{module}.{name}"
        suggestion = closest(name, choices)
        return ConfigProblem(
            f"class_path {wrong!r}: {module} has no {name!r}",
            option,
            locate(None, argv, wrong),
            choices,
            f"{module}.{suggestion}" if suggestion else None,
        )
    if m := re.search(r"No module named '([\w.]+)'", text):
        missing = m.group(1)
        wrong = class_path or missing
        parent, _, name = missing.rpartition(".")
        choices = _module_members(parent) if parent else []
        suggestion = closest(name, choices)
        return ConfigProblem(
            f"class_path {wrong!r}: no module {missing!r}",
            option,
            locate(None, argv, wrong),
            choices,
            wrong.replace(missing, f"{parent}.{suggestion}", 1) if suggestion else None,
        )
    if m := re.search(r"Expected a <class '([\w.]+)'>\. Got value: (.*)$", text):
        name = option.rpartition(".")[2] if option else "the value"
        return ConfigProblem(
            f"{name} expects {m.group(1)}, got {m.group(2)!r}", option, locate(option, argv) if option else None
        )
    if m := re.search(
        r"(?:Subcommand '\w+' does not accept option|Group '[\w.]+' does not accept option) '([\w.]+)'", text
    ):
        return _unknown_key(m.group(1), argv, parser)
    if m := re.search(r"unrecognized arguments: (\S+)", text):
        return _unknown_key(m.group(1).lstrip("-").split("=")[0], argv, parser)
    if m := re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", text):
        value = m.group(1)
        choices = re.findall(r"'([^']*)'", m.group(2))
        return ConfigProblem(f"{value!r} is not a command", None, None, choices, closest(value, choices))
    if m := re.search(r"File does not exist: '([^']*)'", text):
        missing = Path(m.group(1))
        siblings = sorted(p.name for p in missing.parent.glob("*.y*ml")) if missing.parent.is_dir() else []
        suggestion = closest(missing.name, siblings)
        return ConfigProblem(
            f"config file {str(missing)!r} does not exist",
            None,
            None,
            [],
            str(missing.parent / suggestion) if suggestion else None,
        )
    return ConfigProblem(text, option, locate(option, argv) if option else None, *_choices_in(text))


def _unknown_key(key: str, argv: list[str], parser: Any) -> ConfigProblem:
    parent, _, name = key.rpartition(".")
    known = sorted({dest for dest in _parser_keys(parser)})
    if parent:
        siblings = sorted({k[len(parent) + 1 :].split(".")[0] for k in known if k.startswith(parent + ".")})
    else:
        siblings = sorted({k.split(".")[0] for k in known})
    first = key.split(".")[0]
    if parent and not siblings:  # the first component is the misspelled one
        siblings = sorted({k.split(".")[0] for k in known})
        suggestion = closest(first, siblings)
        return ConfigProblem(f"unknown option {key!r}", key, locate(key, argv), siblings, suggestion)
    suggestion = closest(name, siblings)
    return ConfigProblem(
        f"unknown option {key!r}",
        key,
        locate(key, argv),
        siblings,
        f"{parent}.{suggestion}" if parent and suggestion else suggestion,
    )


def _parser_keys(parser: Any) -> list[str]:
    if parser is None:
        return []
    keys = []
    for action in getattr(parser, "_actions", []):
        dest = getattr(action, "dest", None)
        if dest and dest not in ("help", "config", "print_config") and not dest.endswith(".help"):
            keys.append(dest)
    return keys


def _choices_in(text: str) -> tuple[list[str], str | None]:
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


# ------------------------------------------------------------------ errors raised while building or setting up


_WRAPPERS = (os.sep + "jsonargparse" + os.sep, os.path.join("lightning", "pytorch", "cli.py"))


def _root_cause(error: BaseException) -> BaseException:
    """The first error in the `raise ... from` chain that the parser did not raise to wrap another one:
    the configured class's own message (not the library errors that caused it)."""
    chain = [error]
    while chain[-1].__cause__ is not None and len(chain) < 50:
        chain.append(chain[-1].__cause__)
    for candidate in chain:
        frames = traceback.extract_tb(candidate.__traceback__)
        if frames and not any(part in frames[-1].filename for part in _WRAPPERS):
            return candidate
    return chain[-1]


def _raising_objects(error: BaseException, hooks: tuple[str, ...]) -> list[Any]:
    """The `self` of every `__init__` (or hook) frame in the traceback, innermost first."""
    found = []
    tb = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name in ("__init__", *hooks) and "self" in frame.f_locals:
            found.append(frame.f_locals["self"])
        tb = tb.tb_next
    return found[::-1]


def _config_path_of(obj: Any, config: Any) -> tuple[str | None, str | None]:
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
                    if _import(class_path) is cls:
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


def explain_build_error(error: BaseException, argv: list[str], config: Any, during_setup: bool) -> ConfigProblem | None:
    """A `ConfigProblem` for an error a configured class raised, or None when it is not a configuration mistake."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    root = _root_cause(error)
    if isinstance(root, MisconfigurationException):
        return ConfigProblem(str(root).strip().splitlines()[0])
    if during_setup:
        if not isinstance(root, ValueError) or not _in_setup_hook(error):
            return None
        objects = _raising_objects(root, SETUP_HOOKS)
    else:
        if not isinstance(root, (ValueError, FileNotFoundError, ImportError)):
            return None
        objects = _raising_objects(root, ())
    text = str(root).strip()
    obj, section, class_path = None, None, None
    for candidate in objects:  # the innermost object a config section built
        section, class_path = _config_path_of(candidate, config)
        if section is not None:
            obj = candidate
            break
    option = None
    if section is not None:
        # the message starts with the option it is about: `name=...` or `group.name=...` (an option group)
        head = re.match(r"^([a-z_]\w*)(?:\.([a-z_]\w*))?\b", text)
        if head and class_path and head.group(1) in init_options(class_path):
            name = head.group(0) if head.group(2) in group_fields(class_path, head.group(1)) else head.group(1)
            option = f"{section}.init_args.{name}" if section else name
    if option is None and (head := re.match(r"^([a-z_]\w*)\.([a-z_]\w*)\b", text)):
        option, class_path = _group_option(config, *head.groups())  # an option group rejected its own values
    where = locate(option, argv) if option else None
    if option is None and section is not None and obj is not None:
        option = section or None
    choices, suggestion = _choices_in(text)
    tip = _help_tip(section, class_path)
    return ConfigProblem(
        text.splitlines()[0] if len(text) < 2000 else text[:2000], option, where, choices, suggestion, tip
    )


def _group_option(config: Any, group: str, name: str) -> tuple[str | None, str | None]:
    """(`section.init_args.group.name`, class_path) of the configured class that has the option group `group`
    with the field `name`."""
    if config is None:
        return None, None
    tree = config.as_dict() if hasattr(config, "as_dict") else config
    for section, node in tree.items() if isinstance(tree, dict) else ():
        class_path = node.get("class_path") if isinstance(node, dict) else None
        if isinstance(class_path, str) and name in group_fields(class_path, group):
            return f"{section}.init_args.{group}.{name}", class_path
    return None, None


def _in_setup_hook(error: BaseException) -> bool:
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name in SETUP_HOOKS:
            return True
        tb = tb.tb_next
    return False


def is_parse_error(error: BaseException) -> bool:
    return isinstance(error, ArgumentError)


def debug_requested(argv: list[str]) -> tuple[bool, list[str]]:
    """(`--debug` given or RLVR_DEBUG set, argv without `--debug`)."""
    debug = os.environ.get("RLVR_DEBUG", "").lower() not in ("", "0", "false", "no")
    if "--debug" in argv:
        debug = True
        argv = [arg for arg in argv if arg != "--debug"]
        os.environ["RLVR_DEBUG"] = "1"  # the processes Lightning starts for other ranks rerun the command without it
    return debug, argv

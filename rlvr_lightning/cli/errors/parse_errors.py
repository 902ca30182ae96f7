"""`explain_parse_error`: a jsonargparse error message (a misspelled option, an unknown class_path, a value
of the wrong type, a missing config file) as a `ConfigProblem`."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path
from typing import Any

from rlvr_lightning.cli.errors.config_files import config_file_problem
from rlvr_lightning.cli.errors.problem import (
    ConfigProblem,
    choices_in,
    closest,
    group_fields,
    help_tip,
    init_options,
    subclass_names,
    subclasses_of,
)
from rlvr_lightning.runtime.config_locations import locate

# jsonargparse's structural lines, which say nothing about the mistake itself
_NOISE = re.compile(
    r"^(- )?(Does not validate against any of the Union subtypes|Subtypes:|Errors:|Given value( type)?:|"
    r"Expected a <class 'NoneType'>|Not a valid subclass of|Subclass types expect one of|a class path \(str\)|"
    r"a dict with|a dict without)"
)
# a class section given on the command line is first tried as a config file's path: an alternative that says
# nothing when the section's own error follows
_PATH_ATTEMPT = re.compile(r"^Expected a path but .* either not accessible or invalid$")


def _leaf(message: str) -> tuple[list[str], list[str], str]:
    """The innermost informative line of a jsonargparse message, with the option keys and class paths
    leading to it: (keys, classes, text); a failed attempt to read a value as a path only where nothing else
    is said."""
    found = _first_informative(message, skip=_PATH_ATTEMPT) or _first_informative(message)
    if found is None:
        return [], [], message.strip().splitlines()[-1] if message.strip() else message
    return found


def _first_informative(message: str, skip: re.Pattern | None = None) -> tuple[list[str], list[str], str] | None:
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
        if _NOISE.match(body) or (skip is not None and skip.match(body)):
            continue
        keys = [name for _, kind, name in stack if kind == "key"]
        classes = [name for _, kind, name in stack if kind == "class"]
        return keys, classes, body
    return None


def _option_path(keys: list[str], classes: list[str]) -> str:
    """`model` + RLVRModule + `policy` -> `model.init_args.policy` (a key below a class is an init arg)."""
    parts: list[str] = []
    for i, key in enumerate(keys):
        if i > 0 and i - 1 < len(classes):
            parts.append("init_args")
        parts.append(key)
    return ".".join(parts)


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


def explain_parse_error(message: str, argv: list[str], parser: Any = None) -> ConfigProblem:
    """A jsonargparse error message as a `ConfigProblem`."""
    if re.search(r"Problems parsing config|Unexpected config|Path is not a file", message):
        problem = config_file_problem(argv)  # the parser's message lost the file's name, line and column
        if problem is not None:
            return problem
    keys, classes, text = _leaf(message)
    option = _option_path(keys, classes) if keys else None
    class_path = classes[-1] if classes else None

    m = re.search(r"Option '([\w.]+)' is not accepted", text)
    if m is None and class_path:  # a dotted option below a class that has no such option
        m = re.search(r"unrecognized arguments: --([\w.]+)", text)
    if m:
        name = m.group(1)
        choices = init_options(class_path) if class_path else []
        if name.split(".")[0] not in choices:  # `generation.backend`: the class has no `generation`
            name = name.split(".")[0]
        option = f"{option}.init_args.{name}" if option and class_path else name
        owner = class_path.rpartition(".")[2] if class_path else "this section"
        return ConfigProblem(
            f"{owner} has no option {name!r}",
            option,
            locate(option, argv),
            choices,
            closest(name, choices),
            help_tip(keys[0] if len(keys) == 1 and len(classes) == 1 else None, class_path),
        )
    if (m := re.search(r"the following arguments are required: ([\w.]+)", text)) and class_path and option:
        name = m.group(1)
        required = f"{option}.init_args.{name}"
        return ConfigProblem(
            f"{class_path.rpartition('.')[2]} needs {name}: it has no default",
            required,
            locate(required, argv) or locate(option, argv),
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
            help_tip(keys[0] if len(keys) == 1 and len(classes) == 1 else None, class_path),
        )
    if (problem := _class_path_problem(text, option, class_path, argv, message)) is not None:
        return problem
    if (problem := _value_problem(text, message, option, argv)) is not None:
        return problem
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
    return ConfigProblem(text, option, locate(option, argv) if option else None, *choices_in(text))


def _unnested(given: str) -> str:
    """The value itself where jsonargparse shows a value nested in init_args as `NestedArg(key=.., val=..)`."""
    if m := re.fullmatch(r"NestedArg\(key='[^']*', val=(.*)\)", given):
        try:
            return str(ast.literal_eval(m.group(1)))
        except (ValueError, SyntaxError):
            return m.group(1)
    return given


def _value_problem(text: str, message: str, option: str | None, argv: list[str]) -> ConfigProblem | None:
    """A value of the wrong type or out of a Literal's choices (alone or in a union); None for other messages."""
    name = option.rpartition(".")[2] if option else "the value"
    where = locate(option, argv) if option else None
    given, choices = None, []
    if m := re.search(r"Expected a typing\.Literal\[(.*)\]\. Got value: (.*)$", text):
        given, choices = m.group(2), _literal_choices(m.group(1))
    elif re.fullmatch(r"Expected a <class '[\w.]+'>", text) and (
        values := re.findall(r"Given value: (.*)$", message, re.M)
    ):
        given, choices = _unnested(values[-1]), _union_literal_choices(message)  # `precision`: several Literals
        if not choices:
            kinds = [kind.rpartition(".")[2] for kind in _subtypes(message) if kind != "NoneType"]
            return ConfigProblem(f"{name} expects {' or '.join(kinds) or 'another type'}, got {given!r}", option, where)
    elif m := re.search(r"Expected a <class '([\w.]+)'>\. Got value: (.*)$", text):
        return ConfigProblem(f"{name} expects {m.group(1)}, got {m.group(2)!r}", option, where)
    if given is None or not choices:
        return None
    return ConfigProblem(f"{name}={given!r} is not valid", option, where, choices, closest(given, choices))


def _innermost_union(message: str) -> str:
    """The types of the innermost union a jsonargparse message lists (`Subtypes: [...]`), as printed."""
    listed = re.findall(r"Subtypes: \[(.*)\]$", message, re.M)
    return listed[-1] if listed else ""


def _subtypes(message: str) -> list[str]:
    """The classes of the innermost union a jsonargparse message lists, as dotted names; `list[X]` as X."""
    return re.findall(r"(?:<class '|(?<!Literal)\[)([\w.]+)", _innermost_union(message))


def _union_literal_choices(message: str) -> list[str]:
    """The values of the `Literal[...]` types of the innermost union a jsonargparse message lists, in order, each
    once ([] where it lists none)."""
    parts = re.findall(r"Literal\[(.*?)\]", _innermost_union(message))
    return list(dict.fromkeys(value for part in parts for value in _literal_choices(part)))


def _literal_choices(listed: str) -> list[str]:
    """The values of a `typing.Literal[...]` as jsonargparse prints them ([] where they are not plain literals)."""
    try:
        return [str(choice) for choice in ast.literal_eval(f"[{listed}]")]
    except (ValueError, SyntaxError):
        return []


def _class_path_problem(
    text: str, option: str | None, class_path: str | None, argv: list[str], message: str = ""
) -> ConfigProblem | None:
    """A class_path that names no class: the module's members and the closest one; None for other messages."""
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
    if (m := re.search(r"Expected a dot import path string: (\w+)$", text)) and option:
        name = m.group(1)
        if class_path:
            choices = subclass_names(class_path, option.rpartition(".init_args.")[2])
        else:  # an option outside our classes (`trainer.callbacks`): the types the parser tried
            choices = subclasses_of(_subtypes(message))
        return ConfigProblem(
            f"class_path {name!r} names no class this option accepts",
            option,
            locate(option, argv) or locate(None, argv, name),
            choices,
            closest(name, choices),
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
            _not_on_path_tip(missing),
        )
    return None


def _not_on_path_tip(module: str) -> str | None:
    """Where module `module` is a file or package in the current directory, which a console script does not put on
    Python's path: how to make it importable."""
    top = module.split(".")[0]
    here = Path.cwd()
    if (here / f"{top}.py").is_file() or (here / top / "__init__.py").is_file():
        return f"{top} is in {here}, which is not on Python's path: run with PYTHONPATH=. (docs/extending.md)"
    return None


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

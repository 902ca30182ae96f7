"""Where a configuration option was set: the config file and line, or the command-line argument; and
`check_input_file`, where a path option points.

`rlvr fit --config a.yaml --config b.yaml --model.init_args.loss=x` applies its arguments in order,
so the last one that sets an option is where its value came from; `locate` searches from the end.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml


def _yaml_line(path: Path, keys: list[str], value: str | None) -> int | None:
    """1-based line of `keys` (a dotted option path) in a YAML file, or of a scalar equal to `value`."""
    try:
        root = yaml.compose(path.read_text())
    except (OSError, yaml.YAMLError, RecursionError):
        return None
    if root is None:
        return None
    if value is not None:
        found = _find_scalar(root, value)
        if found is not None:
            return found
    node, line = root, None
    for part in keys:
        key, index = re.fullmatch(r"([^\[]+)(?:\[(\d+)\])?", part).groups()
        if not isinstance(node, yaml.MappingNode):
            return None
        match = next(((k, v) for k, v in node.value if getattr(k, "value", None) == key), None)
        if match is None:
            if key == "init_args":  # `model: {class_path: X, loss: y}` leaves init_args out
                continue
            return None
        line, node = match[0].start_mark.line + 1, match[1]
        if index is not None:
            if not isinstance(node, yaml.SequenceNode) or int(index) >= len(node.value):
                return None
            node = node.value[int(index)]
            line = node.start_mark.line + 1
    return line


def _find_scalar(root: Any, value: str) -> int | None:
    """The line of the first scalar equal to `value`, each node visited once (an alias is its anchor's node)."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            if node.value == value:
                return node.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(reversed(node.value))
        elif isinstance(node, yaml.MappingNode):
            stack.extend(reversed([v for _, v in node.value]))
    return None


def locate(option: str | None, argv: list[str], value: str | None = None) -> str | None:
    """Where `option` (or a class path `value`) was last set: "file:line" or "command line: ...".

    Later arguments override earlier ones, so the search runs from the end of the command line."""
    if not option and value is None:
        return None
    keys = option.split(".") if option else []
    short = ".".join(k for k in keys if k != "init_args")
    for i in range(len(argv) - 1, -1, -1):
        arg = argv[i]
        name = arg.split("=", 1)[0].removesuffix("+")  # `--trainer.callbacks+=...` appends to a list
        parent = name.startswith("--") and option is not None and option.startswith(name[2:] + ".")  # a section
        if option and (
            name in (f"--{option}", f"--{short}") or name.startswith((f"--{option}.", f"--{short}.")) or parent
        ):
            return f"command line: {arg if '=' in arg else arg + ' ' + (argv[i + 1] if i + 1 < len(argv) else '')}"
        if (
            value is not None
            and arg.startswith("--")
            and (arg.endswith(f"={value}") or (i + 1 < len(argv) and argv[i + 1] == value))
        ):
            return f"command line: {arg if '=' in arg else arg + ' ' + value}"
        if name in ("--config", "-c"):
            file = arg.split("=", 1)[1] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else None)
            if file and Path(file).is_file():
                line = _yaml_line(Path(file), keys, value)
                if line is not None:
                    return f"{file}:{line}"
    return None


def check_input_file(value: str | os.PathLike, name: str) -> Path:
    """`value` (the option `name`) as the path of an existing file; otherwise FileNotFoundError or
    IsADirectoryError, naming the option and the absolute path looked for (a relative path is read from the
    current directory)."""
    path = Path(value).expanduser()
    if path.is_file():
        return path
    given = f"{name}={str(value)!r}" if name.isidentifier() else f"{name} {str(value)!r}"
    absolute = "" if str(path.resolve()) == str(value) else f" ({path.resolve()})"
    if path.is_dir():
        raise IsADirectoryError(f"{given} is a directory, not a file{absolute}")
    raise FileNotFoundError(f"{given} does not exist" + (f" (looked for {path.resolve()})" if absolute else ""))

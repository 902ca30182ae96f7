"""Bounds on the configuration text `rlvr` reads: its size, its aliases and its nesting.

PyYAML expands aliases without a bound: nine lines of nested anchors and aliases (a "billion laughs") stand
for 10^9 strings, which the parser then walks, copies and checks until memory runs out. A config document
(a `--config` file or string, a file a config names, a value on the command line) is refused with
`ConfigTooLarge`, a `yaml.YAMLError`, when it is longer than `MAX_CONFIG_BYTES` (UTF-8), nested deeper than YAML's
parser can follow, or when its aliases would add more than `MAX_ALIAS_NODES` nodes to it (an alias that
contains itself counts as endless). The check composes the document's node graph, in which an alias is a
second reference to its anchor's node, not a copy: its cost is linear in the text.

`bound_jsonargparse_yaml` puts the check in front of jsonargparse's YAML loader (once); `check_config_file`
checks a file by name, reading no more than the limit.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

MAX_CONFIG_BYTES = 4 * 2**20  # the shipped configs are a few KB; an inline data set of thousands of rows fits
MAX_ALIAS_NODES = 10_000  # nodes the aliases of a document may add to it once expanded
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class ConfigTooLarge(yaml.YAMLError):
    """A configuration document over a bound (size, alias expansion, nesting); the message says which."""


def check_config_text(text: str, name: str = "the config") -> None:
    """Raise `ConfigTooLarge`, naming the document `name`, when `text` is over a bound; a text that is not
    valid YAML is left for the loader to report."""
    size = len(text) if len(text) * 4 <= MAX_CONFIG_BYTES else len(text.encode("utf-8", "replace"))
    if size > MAX_CONFIG_BYTES:
        raise ConfigTooLarge(_too_long(name, size))
    if "*" not in text:  # no alias
        return
    try:
        root = yaml.compose(text, Loader=_Loader)
    except RecursionError:
        raise ConfigTooLarge(f"{name} is nested too deeply to be read") from None
    except yaml.YAMLError:
        return
    added = _nodes_added_by_aliases(root)
    if added is None:
        raise ConfigTooLarge(f"{name} has an alias (*name) inside its own anchor (&name): it never ends")
    if added > MAX_ALIAS_NODES:
        raise ConfigTooLarge(
            f"{name} has aliases (*name) that expand it by {_magnitude(added)} nodes, over the {MAX_ALIAS_NODES:,} "
            "a config may add that way (nested anchors and aliases)"
        )


def check_config_file(path: str | os.PathLike, name: str | None = None) -> None:
    """`check_config_text` on the file `path` (`ConfigTooLarge` names it as `name`, by default "config file
    'PATH'"); a file larger than the limit is refused from its size, without reading it."""
    name = name or f"config file {str(path)!r}"
    path = Path(path)
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigTooLarge(_too_long(name, size))
    with path.open("rb") as f:
        check_config_text(f.read(MAX_CONFIG_BYTES + 1).decode("utf-8", "replace"), name)


def bound_jsonargparse_yaml() -> None:
    """Check every document jsonargparse's YAML loader reads first (`check_config_text`); idempotent."""
    from jsonargparse import get_loader, set_loader

    loader = get_loader("yaml")
    if getattr(loader, "bounded", False):
        return

    def bounded_yaml_load(text):
        if isinstance(text, str):
            check_config_text(text)
        return loader(text)

    bounded_yaml_load.bounded = True
    set_loader("yaml", bounded_yaml_load, exceptions=(yaml.YAMLError,))


def _nodes_added_by_aliases(root: yaml.Node | None) -> int | None:
    """Nodes in the document once its aliases are expanded, minus the nodes written; None for an alias inside
    its own anchor. Iterative, each node visited once (aliases share their anchor's node)."""
    if root is None:
        return 0
    expanded: dict[int, int] = {}  # id(node) -> nodes under it, itself included, aliases expanded
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        children = _children(node)
        if children_done:
            on_path.discard(key)
            expanded[key] = 1 + sum(expanded[id(child)] for child in children)
            continue
        if key in expanded:
            continue
        if key in on_path:
            return None
        on_path.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in on_path:
                return None
            if id(child) not in expanded:
                stack.append((child, False))
    return expanded[id(root)] - len(expanded)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _too_long(name: str, size: int) -> str:
    return f"{name} is {size:,} bytes long, over the {MAX_CONFIG_BYTES:,} a config may have"


def _magnitude(count: int) -> str:
    return f"{count:,}" if count < 10**12 else f"about 10^{len(str(count)) - 1}"

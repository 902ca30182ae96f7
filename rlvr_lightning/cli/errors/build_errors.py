"""`explain_build_error`: an error a configured class raised while it was built, or in a setup hook, as a
`ConfigProblem` that names the option it is about, or None when it is no configuration mistake."""

from __future__ import annotations

import os
import re
import traceback
from typing import Any

from rlvr_lightning.cli.errors.config_files import relative_path_tip
from rlvr_lightning.cli.errors.early_checks import EarlyOptionError
from rlvr_lightning.cli.errors.problem import (
    ConfigProblem,
    choices_in,
    config_path_of,
    group_fields,
    help_tip,
    init_options,
)
from rlvr_lightning.cli.errors.reward_errors import explain_reward_error
from rlvr_lightning.runtime.config_locations import locate

SETUP_HOOKS = ("setup", "configure_optimizers", "configure_model", "on_fit_start")
_WRAPPERS = (os.sep + "jsonargparse" + os.sep, os.path.join("lightning", "pytorch", "cli/app.py"))


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


def explain_build_error(error: BaseException, argv: list[str], config: Any, during_setup: bool) -> ConfigProblem | None:
    """A `ConfigProblem` for an error a configured class raised, or None when it is not a configuration mistake."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    if (problem := explain_reward_error(error, argv, config)) is not None:
        return problem
    root = _root_cause(error)
    if isinstance(root, MisconfigurationException):
        return ConfigProblem(str(root).strip().splitlines()[0])
    if isinstance(root, EarlyOptionError):
        section = root.option.split(".")[0]
        where, tip = locate(root.option, argv), help_tip(section, root.section_class)
        return ConfigProblem(str(root), root.option, where, *choices_in(str(root)), tip=tip)
    if during_setup:
        if not isinstance(root, ValueError) or not _in_setup_hook(error):
            return None
        objects = _raising_objects(root, SETUP_HOOKS)
    else:
        if not isinstance(root, (ValueError, FileNotFoundError, IsADirectoryError, ImportError)):
            return None
        objects = _raising_objects(root, ())
    text = str(root).strip()
    obj, section, class_path = None, None, None
    for candidate in objects:  # the innermost object a config section built
        section, class_path = config_path_of(candidate, config)
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
    if option is None:  # the option (below the section, if known) whose value the message quotes
        option = _option_holding(config, section or "", text)
    where = locate(option, argv) if option else None
    if option is None and section is not None and obj is not None:
        option = section or None
    if _names_a_data_line(text):  # a bad line of a data file: the message says where, no option is wrong
        return ConfigProblem(text.splitlines()[0])
    choices, suggestion = choices_in(text)
    tip = help_tip(section, class_path)
    if isinstance(root, OSError):  # a missing file: where a relative path was looked for
        tip = relative_path_tip(text, argv) or tip
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


def _option_holding(config: Any, section: str, text: str) -> str | None:
    """The one option below config section `section` ("": anywhere) whose value is the first string `text` quotes
    (`Model 'x' was not found` -> `...init_args.model.name_or_path`); None where no single option holds it."""
    quoted = re.search(r"'([^'\n]+)'", text)
    tree = config.as_dict() if hasattr(config, "as_dict") else config
    node: Any = tree
    for key in section.split(".") if section else ():
        node = node.get(key) if isinstance(node, dict) else None
    if quoted is None or not isinstance(node, dict):
        return None
    found: list[str] = []

    def walk(value: Any, path: str) -> None:
        if isinstance(value, dict):
            for key, child in value.items():
                walk(child, f"{path}.{key}" if path else str(key))
        elif value == quoted.group(1):
            found.append(path)

    walk(node, section)
    return found[0] if len(found) == 1 else None


def _names_a_data_line(text: str) -> bool:
    """Whether `text` starts with `file:line: ` of an existing file (a data reader's message about one line)."""
    match = re.match(r"^(\S[^\n]*?):(\d+): ", text)
    return match is not None and os.path.isfile(match.group(1))


def _in_setup_hook(error: BaseException) -> bool:
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name in SETUP_HOOKS:
            return True
        tb = tb.tb_next
    return False

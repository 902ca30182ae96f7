"""`config_file_problem`: what is wrong with a config file the parser could not read, by file, line and column.

jsonargparse reads a config's text without its name: a YAML syntax error reaches the user as "Problems parsing
config: while parsing a flow sequence" and an empty file as "Unexpected config:". The files named on the
command line are read again here, in order, and the first that is not a YAML mapping is described.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from rlvr_lightning.cli.errors.problem import ConfigProblem
from rlvr_lightning.runtime.config_limits import ConfigTooLarge, check_config_file, check_config_text

CONFIG_FLAGS = ("--config", "-c")


def config_files(argv: list[str]) -> list[str]:
    """The files given to `--config` / `-c`, in order."""
    files = []
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in CONFIG_FLAGS:
            if eq:
                files.append(value)
            elif i + 1 < len(argv):
                files.append(argv[i + 1])
    return files


def config_file_problem(argv: list[str]) -> ConfigProblem | None:
    """The first `--config` file of `argv` that is not a readable YAML mapping, described; None if they all are."""
    for file in config_files(argv):
        problem = _file_problem(file)
        if problem is not None:
            return problem
    return None


def config_limit_problem(argv: list[str]) -> ConfigProblem | None:
    """The first `--config` of `argv` (a file, or a config given as a string), or value of another option, over a
    bound of `rlvr_lightning.runtime.config_limits` (size, alias expansion), described; checked before anything
    reads it."""
    configs = config_files(argv)
    for value in configs:
        try:
            is_file = Path(value).is_file()
        except OSError:  # a name too long for a path: a config given as a string
            is_file = False
        try:
            if is_file:
                check_config_file(value)
            else:
                check_config_text(value, "the --config string")
        except ConfigTooLarge as error:
            return ConfigProblem(str(error))
        except OSError:
            continue  # the parser says what is wrong with the file
    for i, arg in enumerate(argv):  # every other value is read as YAML too
        name, eq, value = arg.partition("=")
        if not eq:
            name, value = (argv[i - 1] if i else ""), arg
        if name.startswith("-") and name not in CONFIG_FLAGS and "*" in value:
            try:
                check_config_text(value, f"the value of {name}")
            except ConfigTooLarge as error:
                return ConfigProblem(str(error))
    return None


def _file_problem(file: str) -> ConfigProblem | None:
    path = Path(file)
    if path.is_dir():
        return ConfigProblem(f"config file {file!r} is a directory, not a file")
    if not path.is_file():
        return None  # the parser's own message says the file does not exist
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        return ConfigProblem(f"config file {file!r} is not UTF-8 text (byte {error.start})")
    except OSError as error:
        return ConfigProblem(f"config file {file!r} cannot be read: {error.strerror}")
    try:
        data = yaml.safe_load(text)
    except RecursionError:
        return ConfigProblem(f"config file {file!r} is nested too deeply to be read")
    except yaml.MarkedYAMLError as error:
        return _syntax_problem(file, text, error)
    except yaml.YAMLError as error:
        return ConfigProblem(f"config file {file!r} is not valid YAML: {error}")
    if data is None:
        what = "empty file" if not text.strip() else "empty file (only comments)"
        return ConfigProblem(f"config file {file!r} has no options: {what}")
    if not isinstance(data, dict):
        return ConfigProblem(
            f"config file {file!r} holds a YAML {type(data).__name__}, not a mapping of options "
            "(trainer:, model:, data:, ...)",
            where=f"{file}:1",
        )
    return None


def _syntax_problem(file: str, text: str, error: yaml.MarkedYAMLError) -> ConfigProblem:
    mark = error.problem_mark or error.context_mark
    line, column = mark.line + 1, mark.column + 1
    problem = (error.problem or error.context or "syntax error").strip()
    lines = text.splitlines()
    tip = None
    if 0 <= mark.line < len(lines) and "\t" in lines[mark.line]:
        tip = f"line {line} has a tab: YAML indents with spaces only"
    elif error.context and error.context_mark is not None and error.context_mark is not mark:
        tip = f"{error.context} at line {error.context_mark.line + 1}, column {error.context_mark.column + 1}"
    return ConfigProblem(
        f"YAML syntax error in config file {file!r}: {problem}", None, f"{file}:{line}:{column}", tip=tip
    )


def relative_path_tip(message: str, argv: list[str]) -> str | None:
    """For a message about a relative path (quoted) that does not exist from the current directory: where it does
    exist (beside or above a `--config` file), or that relative paths are read from the current directory."""
    cwd = Path.cwd()
    for quoted in re.findall(r"'([^'\s]+)'", message):
        relative = Path(quoted)
        if relative.is_absolute() or quoted.startswith("~") or "://" in quoted or (cwd / relative).exists():
            continue
        if len(relative.parts) < 2 and not relative.suffix:
            continue  # a bare name (a hub id's last part, an option value), not a path
        for file in config_files(argv):
            for directory in Path(file).resolve().parents:
                if (directory / relative).exists():
                    return (
                        f"{quoted!r} is read relative to the current directory ({cwd}); it exists under {directory}: "
                        "the shipped configs' paths are relative to the repository root, run rlvr from there"
                    )
        if config_files(argv) and all(Path(file).resolve().is_relative_to(cwd) for file in config_files(argv)):
            return None  # run from where its configs are: the path is simply missing
        return (
            f"{quoted!r} is read relative to the current directory ({cwd}); the shipped configs' paths are "
            "relative to the repository root: run rlvr from there"
        )
    return None

"""`Tool`: what a policy may call in the middle of a response. No torch, no Lightning.

A tool is a small class named in YAML (`class_path`) with a `name` and a `run(arguments) -> str`. The
arguments are the call's text (`<calculator>2 + 3</calculator>`, a fenced code block) or, for JSON tool
calls, a dict. A tool that cannot answer raises `ToolError`: its message becomes the observation
("error: ...") and the call counts as a tool error. Model output is untrusted input: a tool never
evaluates it in the training process, and bounds its own time (the Python tool's sandbox time-out).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class ToolError(Exception):
    """The tool could not answer this call; the message is shown to the policy."""


class Tool(ABC):
    """A callable tool. Subclasses set `default_name` and implement `run`."""

    default_name: str = "tool"

    def __init__(self, name: str | None = None) -> None:
        self.name = name or self.default_name
        if not self.name.isidentifier():
            raise ValueError(f"a tool name must be an identifier (letters, digits, _), got {self.name!r}")

    @abstractmethod
    def run(self, arguments: str | dict[str, Any]) -> str:
        """The observation for one call (raise `ToolError` when the call cannot be answered)."""

    @staticmethod
    def text_argument(arguments: str | dict[str, Any], key: str) -> str:
        """The call's text: the arguments themselves, or `arguments[key]` for a JSON call."""
        if isinstance(arguments, str):
            return arguments
        if isinstance(arguments, dict) and isinstance(arguments.get(key), str):
            return arguments[key]
        raise ToolError(f"expected a string argument {key!r}")

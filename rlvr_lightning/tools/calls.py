"""How a tool call looks in a response, and how its observation is written back.

* `TagCalls` (default): `<calculator>12 * 7</calculator>`, one tag per tool name; observation
  `<result>84</result>`. Plain text, so a small model can learn it from a system prompt.
* `FencedCodeCalls`: a fenced ```python block is a call of the Python tool; observation a fenced
  ```output block.
* `JSONCalls`: `<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 7"}}</tool_call>`
  (Hermes / Qwen style); observation `<tool_response>...</tool_response>`.

A format gives the stop strings at which generation pauses (a call is complete only when its closing
text has been sampled), finds the last complete call in a turn's text, and writes the observation
from `observation` with `{output}` replaced. A malformed call (bad JSON) is a call with an `error`.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class ToolCall:
    name: str
    arguments: str | dict[str, Any]
    end: int  # index in the text just after the call
    error: str | None = None  # the call could not be read: this is the observation


class ToolCallFormat(ABC):
    def __init__(self, observation: str) -> None:
        if "{output}" not in observation:
            raise ValueError(f"{type(self).__name__} observation must contain '{{output}}', got {observation!r}")
        self.observation = observation

    @abstractmethod
    def stop_strings(self, tool_names: Sequence[str]) -> list[str]:
        """Where generation must pause to check for a complete call."""

    @abstractmethod
    def last_call(self, text: str, tool_names: Sequence[str]) -> ToolCall | None:
        """The last complete call in `text`, or None."""

    def format_observation(self, output: str) -> str:
        return self.observation.replace("{output}", output)


class TagCalls(ToolCallFormat):
    """`<name>arguments</name>` for each tool name."""

    def __init__(self, observation: str = "<result>{output}</result>") -> None:
        super().__init__(observation)

    def stop_strings(self, tool_names: Sequence[str]) -> list[str]:
        return [f"</{name}>" for name in tool_names]

    def last_call(self, text: str, tool_names: Sequence[str]) -> ToolCall | None:
        names = "|".join(re.escape(name) for name in tool_names)
        matches = list(re.finditer(rf"<({names})>(.*?)</\1>", text, re.DOTALL))
        if not matches:
            return None
        match = matches[-1]
        return ToolCall(match.group(1), match.group(2).strip(), match.end())


class FencedCodeCalls(ToolCallFormat):
    """A fenced code block in `languages` is a call of `tool`."""

    def __init__(
        self,
        tool: str = "python",
        languages: Sequence[str] = ("python", "py"),
        observation: str = "\n```output\n{output}\n```\n",
    ) -> None:
        super().__init__(observation)
        self.tool = tool
        self.languages = [language.lower() for language in languages]
        names = "|".join(re.escape(language) for language in self.languages)
        self._block = re.compile(rf"```[ \t]*(?:{names})[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)

    def stop_strings(self, tool_names: Sequence[str]) -> list[str]:
        return ["```"]  # also stops at the opening fence: no call yet, generation goes on

    def last_call(self, text: str, tool_names: Sequence[str]) -> ToolCall | None:
        matches = list(self._block.finditer(text))
        if not matches:
            return None
        return ToolCall(self.tool, matches[-1].group(1), matches[-1].end())


class JSONCalls(ToolCallFormat):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`."""

    def __init__(self, observation: str = "<tool_response>\n{output}\n</tool_response>\n") -> None:
        super().__init__(observation)

    def stop_strings(self, tool_names: Sequence[str]) -> list[str]:
        return ["</tool_call>"]

    def last_call(self, text: str, tool_names: Sequence[str]) -> ToolCall | None:
        matches = list(re.finditer(r"<tool_call>(.*?)</tool_call>", text, re.DOTALL))
        if not matches:
            return None
        body, end = matches[-1].group(1).strip(), matches[-1].end()
        try:
            call = json.loads(body)
        except ValueError as error:
            return ToolCall("", {}, end, error=f"the tool call is not valid JSON ({error})")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return ToolCall("", {}, end, error='a tool call is {"name": ..., "arguments": {...}}')
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except ValueError:
                pass
        return ToolCall(call["name"], arguments, end)

"""Tools a policy may call in the middle of a response (multi-turn rollouts; `multiturn/tool_use.py`).

No torch, no Lightning: a tool is a small class with a `name` and `run(arguments) -> str`, named in
YAML under the policy's `tools` option.
"""

from rlvr_lightning.tools.base import Tool, ToolError
from rlvr_lightning.tools.calculator import Calculator
from rlvr_lightning.tools.calls import FencedCodeCalls, JSONCalls, TagCalls, ToolCall, ToolCallFormat
from rlvr_lightning.tools.python import PythonTool

__all__ = [
    "Calculator",
    "FencedCodeCalls",
    "JSONCalls",
    "PythonTool",
    "TagCalls",
    "Tool",
    "ToolCall",
    "ToolCallFormat",
    "ToolError",
]

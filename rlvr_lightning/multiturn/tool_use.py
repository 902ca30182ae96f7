"""`ToolUse`: multi-turn rollouts in which the policy calls tools mid-response.

    policy:
      class_path: rlvr_lightning.policies.hf.HFPolicy
      init_args:
        generation:
          tools:
            class_path: rlvr_lightning.multiturn.tool_use.ToolUse
            init_args:
              tools:
                - class_path: rlvr_lightning.tools.Calculator
                - class_path: rlvr_lightning.tools.PythonTool
                  init_args: {timeout_s: 5.0}
              call_format: {class_path: rlvr_lightning.tools.TagCalls}   # <calculator>2+3</calculator>
              max_turns: 4
              max_observation_tokens: 128

Generation pauses at the call format's stop strings; when the text of the current turn (since the last
observation) ends with a complete call, the tool runs and its observation is appended to the response
as tokens with `response_mask` 0 (`TokenSource.TOOL`): no loss, KL or entropy on them, but in the
context of every later token. Generation then continues. At most `max_turns` turns (so `max_turns - 1`
tool calls): a call in the last turn is not run and ends the response (`truncated`). The whole response,
observations included, fits in `sampling.max_new_tokens` (the total token budget). A tool that raises
(`ToolError` or anything else), an unknown tool name or a malformed call gives an error observation
("error: ...") and counts in `tool_errors`; it never stops the run. Tools run one after the other in the
training process; each bounds its own time (the Python tool's sandbox time-out).

Metrics (`train/generation/...`): `tool_calls/mean` (per response), `tool_use_rate` (the share of responses with
at least one call run), `tool_errors` (per step),
`tool_seconds` (per step), `tool_calls_truncated` (calls not run for lack of turns), and the driver's
`turns/mean`, `turns/max`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from rlvr_lightning.multiturn.segmented_generation import Codec, Finish, Insert, RowState, Segment, SegmentRule
from rlvr_lightning.rollout import TokenSource
from rlvr_lightning.tools.base import Tool, ToolError
from rlvr_lightning.tools.calls import TagCalls, ToolCall, ToolCallFormat


class ToolUse(SegmentRule):
    def __init__(
        self,
        tools: Sequence[Tool],
        call_format: ToolCallFormat | None = None,
        max_turns: int = 4,
        max_observation_tokens: int = 256,
        error_prefix: str = "error: ",
    ) -> None:
        """
        Args:
            tools: the tools the policy may call (distinct names).
            call_format: how calls look (default `TagCalls`: `<name>arguments</name>`).
            max_turns: policy turns per response (>= 1; 1 = no tool call is ever run).
            max_observation_tokens: an observation longer than this is cut.
            error_prefix: what an error observation starts with.
        """
        tools = list(tools)
        if not tools:
            raise ValueError("ToolUse needs at least one tool")
        names = [tool.name for tool in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"ToolUse tool names must be distinct, got {names}")
        if max_turns < 1:
            raise ValueError(f"ToolUse max_turns must be >= 1, got {max_turns}")
        if max_observation_tokens < 1:
            raise ValueError(f"ToolUse max_observation_tokens must be >= 1, got {max_observation_tokens}")
        self.tools = {tool.name: tool for tool in tools}
        self.call_format = call_format or TagCalls()
        self.max_turns = max_turns
        self.max_observation_tokens = max_observation_tokens
        self.error_prefix = error_prefix

    @property
    def stop_strings(self) -> list[str]:
        return self.call_format.stop_strings(list(self.tools))

    def begin(self, row: RowState, codec: Codec) -> None:
        row.notes.update(tool_calls=0, tool_errors=0, tool_seconds=0.0, tool_calls_truncated=0)

    def observe(self, row: RowState, segment: Segment, codec: Codec) -> Insert | Finish | None:
        if segment.ended != "stop":
            return None
        turn_start = max((i + 1 for i, s in enumerate(row.sources) if s == TokenSource.TOOL), default=0)
        before = codec.decode(row.tokens[turn_start : len(row.tokens) - len(segment.tokens)])
        text = before + segment.text
        call = self.call_format.last_call(text, list(self.tools))
        if call is None or call.end <= len(before):
            return None  # no call, or one that ended before this segment (already answered)
        if row.notes["tool_calls"] + 1 >= self.max_turns:
            row.notes["tool_calls_truncated"] += 1
            return Finish(truncated=True)
        row.notes["tool_calls"] += 1
        output = self._run(call, row)
        return Insert(
            text=self.call_format.format_observation(output),
            source=TokenSource.TOOL,
            max_tokens=self.max_observation_tokens,
        )

    def _run(self, call: ToolCall, row: RowState) -> str:
        started = time.perf_counter()
        try:
            if call.error is not None:
                raise ToolError(call.error)
            tool = self.tools.get(call.name)
            if tool is None:
                raise ToolError(f"unknown tool {call.name!r}; the tools are {sorted(self.tools)}")
            return tool.run(call.arguments)
        except Exception as error:  # a tool's failure is this call's observation, not the run's end
            row.notes["tool_errors"] += 1
            message = str(error) if isinstance(error, ToolError) else f"{type(error).__name__}: {error}"
            return self.error_prefix + message
        finally:
            row.notes["tool_seconds"] += time.perf_counter() - started

    def stats(self, rows: Sequence[RowState]) -> dict[str, float]:
        total = lambda key: float(sum(row.notes[key] for row in rows))  # noqa: E731
        return {
            "tool_calls/mean": total("tool_calls") / max(len(rows), 1),
            "tool_use_rate": sum(row.notes["tool_calls"] > 0 for row in rows) / max(len(rows), 1),
            "tool_errors": total("tool_errors"),
            "tool_seconds": total("tool_seconds"),
            "tool_calls_truncated": total("tool_calls_truncated"),
        }

"""Tool call formats: stop strings, the last complete call of a text, observations."""

from __future__ import annotations

import pytest

from rlvr_lightning.tools import FencedCodeCalls, JSONCalls, TagCalls


def test_tag_calls():
    calls = TagCalls()
    assert calls.stop_strings(["calculator", "python"]) == ["</calculator>", "</python>"]
    text = "First <calculator>1+1</calculator> then <calculator> 2*3 </calculator>"
    call = calls.last_call(text, ["calculator"])
    assert (call.name, call.arguments, call.end) == ("calculator", "2*3", len(text))
    assert calls.last_call("<calculator>1+1", ["calculator"]) is None  # not closed yet
    assert calls.last_call("<python>1</python>", ["calculator"]) is None  # not a tool of this run
    assert calls.format_observation("5") == "<result>5</result>"


def test_fenced_code_calls():
    calls = FencedCodeCalls()
    assert calls.stop_strings(["python"]) == ["```"]
    assert calls.last_call("Let me run:\n```python", ["python"]) is None  # only the opening fence
    text = "```py\nprint(1)\n```\nand\n```python\nprint(2)\n```"
    call = calls.last_call(text, ["python"])
    assert (call.name, call.arguments, call.end) == ("python", "print(2)\n", len(text))
    assert calls.last_call("```text\nhello\n```", ["python"]) is None


def test_json_calls():
    calls = JSONCalls()
    good = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>'
    call = calls.last_call(good, ["calculator"])
    assert (call.name, call.arguments, call.error) == ("calculator", {"expression": "2+2"}, None)
    as_string = '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1\\"}"}</tool_call>'
    assert calls.last_call(as_string, ["calculator"]).arguments == {"expression": "1"}
    assert "not valid JSON" in calls.last_call("<tool_call>{name: x}</tool_call>", ["calculator"]).error
    assert calls.last_call('<tool_call>["calculator"]</tool_call>', ["calculator"]).error.startswith("a tool call is")


def test_an_observation_template_needs_the_output():
    with pytest.raises(ValueError, match="{output}"):
        TagCalls(observation="<result></result>")

"""Segmented generation (tool observations, forced text) over a planned fake backend: exact tokens, masks,
sources, log-probs, budgets, turn limits, error observations and what each round asks the backend."""

from __future__ import annotations

import pytest
import torch
from planned_backend import PlannedBackend, sampled_log_prob

from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.multiturn.segmented_generation import decode_responses, generate_segments
from rlvr_lightning.multiturn.thinking_budget import ThinkingBudget
from rlvr_lightning.multiturn.tool_use import ToolUse
from rlvr_lightning.rollout import TokenSource
from rlvr_lightning.tools import Calculator, FencedCodeCalls, Tool, ToolError

S, T, F = TokenSource.SAMPLED, TokenSource.TOOL, TokenSource.FORCED
MODEL = torch.nn.Linear(1, 1)  # the driver only asks it for a device


def run(tokenizer, plan, rules, prompts=("What is 2+3?",), n=1, **sampling):
    backend = PlannedBackend(tokenizer, plan)
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    sampling.setdefault("max_new_tokens", 64)
    out = generate_segments(
        backend, MODEL, tokenizer, ids, list(prompts), n, SamplingConfig(**sampling), rules,
        eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    return out, backend, ids


def enc(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def calculator_plan(context: str) -> str:
    if "<result>" not in context:
        return "<calculator>2+3</calculator> never sampled"
    return "The answer is 5.<eos>"


def test_observation_is_inserted_masked_and_continued_from(tool_tokenizer):
    tok = tool_tokenizer
    out, backend, prompt_ids = run(tok, calculator_plan, [ToolUse([Calculator()])], n=2)
    call, observation, answer = (
        enc(tok, "<calculator>2+3</calculator>"),
        enc(tok, "<result>5</result>"),
        enc(tok, "The answer is 5."),
    )
    expected = call + observation + answer + [tok.eos_token_id]
    sources = [S] * len(call) + [T] * len(observation) + [S] * (len(answer) + 1)
    for row in range(2):
        assert out.response_ids[row].tolist() == expected
        assert out.response_source[row].tolist() == sources
        assert out.response_mask[row].tolist() == [float(s == S) for s in sources]
        recorded = [sampled_log_prob(i) for i in range(len(call))] + [0.0] * len(observation)
        recorded += [sampled_log_prob(i) for i in range(len(answer) + 1)]
        torch.testing.assert_close(out.log_probs[row], torch.tensor(recorded))
    assert not out.truncated.any() and not out.stopped_by_string.any()
    # round 0: the distinct prompt, n rows; round 1: each row's context so far, one row each, its budget left
    first, second = backend.calls
    assert first["prompts"] == prompt_ids and first["n"] == 2 and first["caps"] == [64]
    assert "</calculator>" in first["stop"]
    context = prompt_ids[0] + call + observation
    assert second["prompts"] == [context, context] and second["n"] == 1
    assert second["caps"] == [64 - len(call) - len(observation)] * 2
    assert out.stats["tool_calls/mean"] == 1.0 and out.stats["turns/mean"] == 2.0 and out.stats["tool_errors"] == 0.0
    assert out.stats["rounds"] == 2.0


def test_the_tool_use_rate_is_the_share_of_responses_that_called_a_tool(tool_tokenizer):
    plan = lambda context: "hi<eos>" if "2+3" not in context else calculator_plan(context)  # noqa: E731
    out, _, _ = run(tool_tokenizer, plan, [ToolUse([Calculator()])], prompts=("What is 2+3?", "Say hi."), n=2)
    assert out.stats["tool_use_rate"] == 0.5 and out.stats["tool_calls/mean"] == 0.5  # 2 of 4 rows, one call each


def test_the_token_budget_counts_and_cuts_observations(tool_tokenizer):
    tok = tool_tokenizer
    call = enc(tok, "<calculator>2+3</calculator>")
    budget = len(call) + 2  # room for two of the observation's three tokens
    out, _, _ = run(tok, calculator_plan, [ToolUse([Calculator()])], max_new_tokens=budget)
    assert out.response_source[0].tolist() == [S] * len(call) + [T, T]
    assert out.response_ids[0].tolist() == call + enc(tok, "<result>5</result>")[:2]
    assert out.truncated.tolist() == [True]


def test_a_call_beyond_max_turns_is_not_run_and_ends_the_response(tool_tokenizer):
    tok = tool_tokenizer
    keeps_calling = lambda context: "<calculator>1+1</calculator>"  # noqa: E731
    out, backend, _ = run(tok, keeps_calling, [ToolUse([Calculator()], max_turns=3)])
    call, observation = enc(tok, "<calculator>1+1</calculator>"), enc(tok, "<result>2</result>")
    assert out.response_ids[0].tolist() == (call + observation) * 2 + call
    assert out.truncated.tolist() == [True]
    assert len(backend.calls) == 3
    assert (
        out.stats["tool_calls/mean"] == 2.0
        and out.stats["tool_calls_truncated"] == 1.0
        and out.stats["turns/max"] == 3.0
    )


class Exploding(Tool):
    default_name = "explode"

    def run(self, arguments):
        raise RuntimeError("boom")


@pytest.mark.parametrize(
    ("call", "observation"),
    [
        ("<calculator>1/0</calculator>", "<result>error: division by zero</result>"),
        (
            "<calculator>__import__('os')</calculator>",
            "<result>error: cannot read '__import__' at character 0</result>",
        ),
        ("<explode>now</explode>", "<result>error: RuntimeError: boom</result>"),
    ],
)
def test_tool_errors_become_observations(tool_tokenizer, call, observation):
    tok = tool_tokenizer
    plan = lambda context: call if "<result>" not in context else "ok<eos>"  # noqa: E731
    out, _, _ = run(tok, plan, [ToolUse([Calculator(), Exploding()])], n=2)
    text = tok.decode(out.response_ids[0][out.response_source[0] != TokenSource.PAD].tolist())
    assert text == call + observation + "ok" + tok.eos_token
    assert out.stats["tool_errors"] == 2.0 and out.stats["tool_calls/mean"] == 1.0


class Recorder(Tool):
    default_name = "python"

    def __init__(self):
        super().__init__()
        self.seen = []

    def run(self, arguments):
        self.seen.append(arguments)
        return "42"


def test_an_opening_fence_continues_and_the_closing_one_calls(tool_tokenizer):
    tok = tool_tokenizer
    tool = Recorder()

    def plan(context):
        if "```output" in context:
            return "Done.<eos>"
        if context.endswith("```"):  # stopped at the opening fence: the code comes next
            return "python\nprint(6*7)\n``` never"
        return "Run:\n```python"

    out, backend, _ = run(tok, plan, [ToolUse([tool], call_format=FencedCodeCalls())])
    assert tool.seen == ["print(6*7)\n"]
    assert len(backend.calls) == 3  # opening fence (no call, nothing inserted), closing fence (call), answer
    text = tok.decode(out.response_ids[0][out.response_source[0] != TokenSource.PAD].tolist())
    assert text == "Run:\n```python\nprint(6*7)\n```\n```output\n42\n```\nDone." + tok.eos_token
    assert out.stats["turns/mean"] == 2.0


def test_stop_strings_cut_only_the_last_turn(tool_tokenizer):
    tok = tool_tokenizer
    plan = lambda context: "<calculator>5/2</calculator>" if "<result>" not in context else "It is 2.5. Yes<eos>"  # noqa: E731
    out, _, _ = run(tok, plan, [ToolUse([Calculator()])], stop_strings=["."])
    assert out.stopped_by_string.tolist() == [True]
    lengths, texts = decode_responses(tok, out, ["."])
    # the observation's "." does not end the response; the answer's first "." does
    assert texts == ["<calculator>5/2</calculator><result>2.5</result>It is 2."]
    assert lengths.tolist() == [float((out.response_source[0] != TokenSource.PAD).sum())]


def never_closes(context: str) -> str:
    if context.endswith("</think>\n\n"):
        return "The answer is 5.<eos>"
    return " ab" * 40  # thinks forever


def test_thinking_budget_forces_the_close_after_the_cap(tool_tokenizer):
    tok = tool_tokenizer
    budget = ThinkingBudget(max_thinking_tokens=5)
    out, backend, _ = run(tok, never_closes, [budget], prompts=("Think. <think>",), n=2, max_new_tokens=30)
    forced, answer = enc(tok, "\n</think>\n\n"), enc(tok, "The answer is 5.")
    thinking = enc(tok, " ab" * 40)[:5]
    assert out.response_ids[0].tolist() == thinking + forced + answer + [tok.eos_token_id]
    assert out.response_source[0].tolist() == [S] * 5 + [F] * len(forced) + [S] * (len(answer) + 1)
    assert out.response_mask[0].tolist() == [1.0] * 5 + [0.0] * len(forced) + [1.0] * (len(answer) + 1)
    assert out.log_probs[0, 5 : 5 + len(forced)].eq(0).all()
    assert [call["caps"] for call in backend.calls] == [[5], [30 - 5 - len(forced)] * 2]
    assert "<think>" in backend.calls[0]["stop"] and "</think>" in backend.calls[0]["stop"]
    assert out.stats["thinking/forced_fraction"] == 1.0 and out.stats["thinking/tokens_mean"] == 5.0
    assert out.stats["turns/mean"] == 1.0  # a forced close does not start a turn


def test_thinking_opened_by_the_model_is_capped_from_there(tool_tokenizer):
    tok = tool_tokenizer
    plan = lambda context: "Let me see. <think>" if "<think>" not in context else never_closes(context)  # noqa: E731
    out, backend, _ = run(tok, plan, [ThinkingBudget(max_thinking_tokens=3)], max_new_tokens=40)
    opening = enc(tok, "Let me see. <think>")
    assert out.response_source[0].tolist()[: len(opening) + 3 + 1] == [S] * (len(opening) + 3) + [F]
    assert backend.calls[1]["caps"] == [3]


def test_thinking_closed_in_time_is_left_alone(tool_tokenizer):
    tok = tool_tokenizer
    plan = lambda context: " ab ab</think>" if context.endswith("<think>") else "5<eos>"  # noqa: E731
    out, _, _ = run(tok, plan, [ThinkingBudget(max_thinking_tokens=50)], prompts=("Q <think>",))
    assert (out.response_source[0] != F).all()
    assert tok.decode(out.response_ids[0].tolist()) == " ab ab</think>5" + tok.eos_token
    assert out.stats["thinking/forced_fraction"] == 0.0


def test_tool_observations_inside_thinking_do_not_use_its_budget(tool_tokenizer):
    tok = tool_tokenizer

    def plan(context):
        if context.endswith("</think>\n\n"):
            return "5<eos>"
        if "<result>" not in context:
            return "<calculator>2+3</calculator>"
        return " ab" * 40

    out, backend, _ = run(
        tok, plan, [ThinkingBudget(max_thinking_tokens=8), ToolUse([Calculator()])], prompts=("Q <think>",)
    )
    call = enc(tok, "<calculator>2+3</calculator>")
    observation = enc(tok, "<result>5</result>")
    assert backend.calls[1]["caps"] == [8 - len(call)]  # the sampled call counts, the observation does not
    sources = out.response_source[0].tolist()
    assert sources[: len(call) + len(observation) + (8 - len(call)) + 1] == [S] * len(call) + [T] * len(observation) + [
        S
    ] * (8 - len(call)) + [F]


def test_rule_options_are_checked():
    with pytest.raises(ValueError, match="forced_text"):
        ThinkingBudget(4, forced_text="answer now")
    with pytest.raises(ValueError, match="max_turns"):
        ToolUse([Calculator()], max_turns=0)
    with pytest.raises(ValueError, match="distinct"):
        ToolUse([Calculator(), Calculator()])
    with pytest.raises(ValueError, match="identifier"):
        Calculator(name="my calc")
    with pytest.raises(ToolError):
        Calculator().run({"expr": "1"})

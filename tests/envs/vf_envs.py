"""Two small verifiers environments built on the spot (no hub download): a single-turn one with an XML parser
and a two-function rubric, and a multi-turn guessing game whose environment answers "higher"/"lower"."""

from __future__ import annotations

import pytest

vf = pytest.importorskip("verifiers", reason="verifiers is not installed: pip install 'rlvr-lightning[envs]'")
from datasets import Dataset  # noqa: E402

QUESTIONS = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in [(2, 2), (3, 5), (1, 6), (4, 4)]]


def exact_answer(completion, answer, parser) -> float:
    return float((parser.parse_answer(completion) or "").strip() == answer)


def single_turn(num_rows: int = 4, system_prompt: str = "Answer inside <answer></answer>."):
    parser = vf.XMLParser(["answer"], answer_field="answer")
    rubric = vf.Rubric(funcs=[exact_answer, parser.get_format_reward_func()], weights=[1.0, 0.25], parser=parser)
    dataset = Dataset.from_list(QUESTIONS[:num_rows])
    return vf.SingleTurnEnv(dataset=dataset, system_prompt=system_prompt, parser=parser, rubric=rubric)


class GuessEnv(vf.MultiTurnEnv):
    """Guess the number: after each guess the environment says "higher", "lower" or "correct" (final)."""

    async def setup_state(self, state, **kwargs):
        state["guesses"] = 0
        return state

    async def env_response(self, messages, state, **kwargs):
        guess = (self.parser.parse_answer(messages) or "").strip()
        state["guesses"] += 1  # set up by setup_state
        target = int(state["answer"])
        if guess.lstrip("-").isdigit() and int(guess) == target:
            state["final_env_response"] = [{"role": "user", "content": "correct"}]
            return state["final_env_response"]
        hint = "higher" if not guess.lstrip("-").isdigit() or int(guess) < target else "lower"
        return [{"role": "user", "content": hint}]


def solved_in_few_guesses(completion, answer, parser, state) -> float:
    """1 for a right final guess, less the more guesses it took (reads the environment's state)."""
    right = (parser.parse_answer(completion) or "").strip() == answer
    return float(right) / max(state.get("guesses", 1), 1)


def multi_turn(max_turns: int = 3):
    parser = vf.XMLParser(["answer"], answer_field="answer")
    rubric = vf.Rubric(funcs=[solved_in_few_guesses], weights=[1.0], parser=parser)
    dataset = Dataset.from_list([{"question": "Guess my number between 1 and 9.", "answer": "5"}])
    return GuessEnv(dataset=dataset, parser=parser, rubric=rubric, max_turns=max_turns)

"""A verifiers environment through our task, reward and sampling: its dataset (prompts as chat messages), its
rubric with its weights and parser as our reward, and a multi-turn protocol played by segmented generation,
token ids in and out. The environments are built in `vf_envs.py` (no hub download)."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr_lightning.data.task import collate_examples  # noqa: I001
from rlvr_lightning.data.verifiers_task import VerifiersTask
from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.multiturn.tool_use import ToolUse
from rlvr_lightning.multiturn.verifiers_turns import VerifiersTurns
from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions, PromptOptions
from rlvr_lightning.rewards.verifiers_rubric import VerifiersRubricReward
from rlvr_lightning.rollout import Rollout, TokenSource
from rlvr_lightning.runtime.vf_environments import load_environment, new_state, normalize, run
from tests.envs import vf_envs  # noqa: F401  (skips the module without verifiers)
from tests.policies.planned_backend import PlannedBackend

SINGLE, MULTI = "tests.envs.vf_envs:single_turn", "tests.envs.vf_envs:multi_turn"


def metadata(examples):
    return [{k: v for k, v in e.items() if k != "prompt"} for e in examples]


def test_the_task_serves_the_environments_formatted_dataset_and_holds_rows_out():
    task = VerifiersTask(SINGLE, num_val=1)
    assert len(task.train_dataset()) == 3 and len(task.val_dataset()) == 1
    example = task.train_dataset()[0]
    assert example["prompt"] == [
        {"role": "system", "content": "Answer inside <answer></answer>."},
        {"role": "user", "content": "What is 2 + 2?"},
    ]
    assert example["answer"] == "4" and example["vf_input"]["question"] == "What is 2 + 2?"
    assert task.val_dataset()[0]["answer"] == "8"  # the last row
    assert load_environment(SINGLE) is task.env, "one environment per process for the same arguments"
    with pytest.raises(ValueError, match="num_val=4 leaves no training rows of the 4"):
        VerifiersTask(SINGLE, num_val=4)


def test_the_reward_is_the_rubrics_weighted_sum_as_verifiers_scores_it():
    task = VerifiersTask(SINGLE)
    examples = [task.train_dataset()[i] for i in range(4)] * 2
    texts = ["<answer>4</answer>", "<answer>7</answer>", "8", "<answer> 7 </answer>", "", "x", "<answer>", "7"]
    reward = VerifiersRubricReward(SINGLE)
    scores = reward(Rollout.from_texts(texts, metadata=metadata(examples)))
    env = task.env
    expected = []
    for text, example in zip(texts, examples, strict=True):
        state = new_state(env, example["vf_input"])
        state["completion"] = normalize([{"role": "assistant", "content": text}])
        state["trajectory"], state["timing"] = [], state["timing"]
        run(env.rubric.score_rollout(state))  # verifiers' own scoring
        expected.append(state["reward"])
    assert scores.tolist() == pytest.approx(expected)
    assert scores[0].item() == pytest.approx(1.25), "1.0 x exact answer + 0.25 x format"
    assert reward.is_correct(None, scores).tolist() == [s >= 1.25 - 1e-9 for s in scores.tolist()]


@pytest.mark.parametrize("bad", [lambda: 1 / 0, lambda: math.nan], ids=["raises", "nan"])
def test_a_failing_reward_function_fails_its_row_only(bad):
    task = VerifiersTask(SINGLE)
    examples = [task.train_dataset()[i] for i in range(3)]
    reward = VerifiersRubricReward(SINGLE)
    name, function, weight, rubric = reward.terms[0]

    def sometimes_bad(completion, answer, parser):
        return bad() if answer == "8" else function(completion, answer, parser)

    reward.terms = [(name, sometimes_bad, weight, rubric), *reward.terms[1:]]
    texts = ["<answer>4</answer>", "<answer>8</answer>", "<answer>7</answer>"]
    scores = reward(Rollout.from_texts(texts, metadata=metadata(examples)))
    assert scores.tolist() == [1.25, 0.0, 1.25]
    assert reward.num_errors == 1


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(save_tiny_tokenizer(tmp_path_factory.mktemp("tok"))))


def guess_plan(context: str) -> str:
    """The scripted policy guesses 3, then (told "higher") 5."""
    return "<answer>5</answer><eos>" if "higher" in context else "<answer>3</answer><eos>"


def multi_turn_policy(tokenizer, plan, max_turns=3):
    from rlvr_lightning.policies.hf import HFPolicy

    torch.manual_seed(0)
    return HFPolicy(
        model=HFModelOptions(config=tiny_llama_config(), tokenizer=tokenizer.name_or_path),
        prompt=PromptOptions(template="chat"),
        generation=GenerationOptions(
            tools=VerifiersTurns(MULTI, {"max_turns": max_turns}), backend=PlannedBackend(tokenizer, plan)
        ),
    )


def test_a_multi_turn_environment_plays_through_segmented_generation(tokenizer):
    task = VerifiersTask(MULTI, {"max_turns": 3})
    policy = multi_turn_policy(tokenizer, guess_plan)
    rollout = policy.sample(collate_examples([task.train_dataset()[0]]), 2, SamplingConfig(max_new_tokens=64))
    tok = policy.tokenizer
    eos = tok.eos_token_id
    first, second = tok("<answer>3</answer>", add_special_tokens=False)["input_ids"], None
    second = tok("<answer>5</answer>", add_special_tokens=False)["input_ids"]
    # the environment's reply as the chat template renders it after the assistant's turn
    reply = tok("<|user|>higher<|endoftext|><|assistant|>", add_special_tokens=False)["input_ids"]
    expected = first + [eos] + reply + second + [eos]
    sources = [TokenSource.SAMPLED] * (len(first) + 1) + [TokenSource.TOOL] * len(reply)
    sources += [TokenSource.SAMPLED] * (len(second) + 1)
    for row in range(2):
        assert rollout.response_ids[row].tolist() == expected, "sampled ids kept as sampled, the reply inserted"
        assert rollout.response_source[row].tolist() == sources
        assert rollout.response_mask[row].tolist() == [float(s == TokenSource.SAMPLED) for s in sources]
        assert rollout.metadata[row]["vf_completion"] == [
            {"role": "assistant", "content": "<answer>3</answer>"},
            {"role": "user", "content": "higher"},
            {"role": "assistant", "content": "<answer>5</answer>"},
            {"role": "user", "content": "correct"},
        ]
        assert rollout.metadata[row]["vf_state"]["guesses"] == 2
    assert rollout.num_turns().tolist() == [2, 2]
    scores = VerifiersRubricReward(MULTI, {"max_turns": 3})(rollout)
    assert scores.tolist() == [0.5, 0.5], "right in the end, in 2 guesses (the rubric reads the state)"


def test_max_turns_ends_the_conversation(tokenizer):
    task = VerifiersTask(MULTI, {"max_turns": 1})
    policy = multi_turn_policy(tokenizer, guess_plan, max_turns=1)
    rollout = policy.sample(collate_examples([task.train_dataset()[0]]), 1, SamplingConfig(max_new_tokens=64))
    assert rollout.metadata[0]["vf_completion"] == [{"role": "assistant", "content": "<answer>3</answer>"}]
    assert rollout.response_source[0].tolist() == [TokenSource.SAMPLED] * rollout.response_ids.shape[1]
    assert VerifiersRubricReward(MULTI, {"max_turns": 1})(rollout).tolist() == [0.0]


def test_an_environment_that_raises_ends_its_row_only(tokenizer, monkeypatch):
    task = VerifiersTask(MULTI, {"max_turns": 3})
    policy = multi_turn_policy(tokenizer, guess_plan)
    turns = policy.segment_rules[0]

    async def broken(messages, state, **kwargs):
        raise RuntimeError("environment down")

    monkeypatch.setattr(turns.env, "env_response", broken)
    rollout = policy.sample(collate_examples([task.train_dataset()[0]]), 2, SamplingConfig(max_new_tokens=64))
    assert rollout.truncated.tolist() == [True, True]
    assert [m["vf_completion"] for m in rollout.metadata] == [
        [{"role": "assistant", "content": "<answer>3</answer>"}]
    ] * 2
    assert policy.last_generation_stats is not None and turns.env_errors == 0  # reported in the stats, then reset


def test_a_rollout_with_environment_state_pickles(tokenizer):
    import pickle

    task = VerifiersTask(MULTI, {"max_turns": 3})
    rollout = multi_turn_policy(tokenizer, guess_plan).sample(
        collate_examples([task.train_dataset()[0]]), 1, SamplingConfig(max_new_tokens=64)
    )
    again = pickle.loads(pickle.dumps(rollout.metadata))
    assert again[0]["vf_state"]["guesses"] == 2 and again[0]["vf_completion"] == rollout.metadata[0]["vf_completion"]


def test_a_config_names_the_environments_turns_as_the_policys_multi_turn_rule():
    """`generation.tools` takes any segment rule from YAML, as environments.md shows: `VerifiersTurns` too."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_argument("--generation", type=GenerationOptions)
    turns = {"class_path": "rlvr_lightning.multiturn.VerifiersTurns", "init_args": {"environment": MULTI}}
    tools = {
        "class_path": "rlvr_lightning.multiturn.ToolUse",
        "init_args": {"tools": ["rlvr_lightning.tools.Calculator"]},
    }
    for rule, kind in [(turns, VerifiersTurns), (tools, ToolUse)]:
        config = parser.parse_object({"generation": {"tools": rule}})
        assert isinstance(parser.instantiate_classes(config).generation.tools, kind)

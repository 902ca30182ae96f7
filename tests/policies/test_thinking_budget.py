"""The thinking budget on a tiny Llama that never closes its thinking (EOS and `</think>` are suppressed):
the close is forced after exactly `max_thinking_tokens` sampled tokens, masked out, and the answer follows."""

from __future__ import annotations

import torch
from scripted_lm import script_weights, transitions

from rlvr_lightning.demos.tiny_lm import bias_tokens, tiny_llama_config
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.multiturn.thinking_budget import ThinkingBudget
from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions, PromptOptions
from rlvr_lightning.rollout import TokenSource

FORCED = "\nConsidering the limited time, I answer now.\n</think>\n\n"


def thinking_policy(tokenizer_dir, budget=6, **kwargs):
    from rlvr_lightning.policies.hf import HFPolicy

    torch.manual_seed(0)
    return HFPolicy(
        model=HFModelOptions(config=tiny_llama_config(), tokenizer=str(tokenizer_dir)),
        prompt=PromptOptions(template="{prompt} <think>"),  # R1-Zero style: the prompt opens the thinking
        generation=GenerationOptions(thinking_budget=ThinkingBudget(max_thinking_tokens=budget, forced_text=FORCED)),
        **kwargs,
    )


def test_a_model_that_never_closes_is_forced_to_answer(tool_tokenizer_dir):
    policy = thinking_policy(tool_tokenizer_dir, budget=6)
    tok = policy.tokenizer
    never = bias_tokens(policy, [tok.eos_token_id, tok.convert_tokens_to_ids("</think>")], float("-inf"))
    torch.manual_seed(0)
    rollout = policy.sample({"prompt": ["What is 2+3?", "Say ab."]}, 3, SamplingConfig(max_new_tokens=50))
    forced = tok(FORCED, add_special_tokens=False)["input_ids"]
    source = (
        [TokenSource.SAMPLED] * 6 + [TokenSource.FORCED] * len(forced) + [TokenSource.SAMPLED] * (50 - 6 - len(forced))
    )
    for row in range(rollout.num_rows):
        assert (
            rollout.response_source[row].tolist() == source
        )  # never closes: thinking, forced close, answer to the budget
        assert rollout.response_ids[row, 6 : 6 + len(forced)].tolist() == forced
        assert rollout.response_mask[row].tolist() == [float(s == TokenSource.SAMPLED) for s in source]
        assert "</think>" not in tok.decode(rollout.response_ids[row, :6].tolist())
    assert rollout.truncated.all()  # the answer ran to max_new_tokens
    assert rollout.sampling_log_probs[:, 6 : 6 + len(forced)].eq(0).all()
    assert all(FORCED.strip() in text for text in rollout.response_text)
    stats = policy.last_generation_stats
    assert stats["thinking/forced_fraction"] == 1.0 and stats["thinking/tokens_mean"] == 6.0
    # the answer was sampled with the forced text in its context, exactly as the trainer scores it
    log_probs, _ = policy.token_log_probs(rollout)
    never.remove()
    assert (log_probs.detach() - rollout.sampling_log_probs).abs().max() < 1e-5
    assert log_probs[rollout.response_mask == 0].eq(0).all()


def test_without_a_budget_the_same_model_thinks_to_the_end(tool_tokenizer_dir):
    """The control: what the budget changes."""
    from rlvr_lightning.policies.hf import HFPolicy

    torch.manual_seed(0)
    policy = HFPolicy(
        model=HFModelOptions(config=tiny_llama_config(), tokenizer=str(tool_tokenizer_dir)),
        prompt=PromptOptions(template="{prompt} <think>"),
    )
    tok = policy.tokenizer
    bias_tokens(policy, [tok.eos_token_id, tok.convert_tokens_to_ids("</think>")], float("-inf"))
    rollout = policy.sample({"prompt": ["What is 2+3?"]}, 2, SamplingConfig(max_new_tokens=30))
    assert rollout.response_source is None and rollout.response_mask.all()
    assert not any("</think>" in text for text in rollout.response_text)


def test_a_model_that_opens_thinking_itself_is_capped_from_there(tool_tokenizer_dir):
    from rlvr_lightning.policies.hf import HFPolicy

    torch.manual_seed(0)
    policy = HFPolicy(
        model=HFModelOptions(config=tiny_llama_config(), tokenizer=str(tool_tokenizer_dir)),
        prompt=PromptOptions(template="raw"),
        generation=GenerationOptions(thinking_budget=ThinkingBudget(max_thinking_tokens=4)),
    )
    tok = policy.tokenizer
    question = tok("What is 2+3?", add_special_tokens=False)["input_ids"]
    # Qwen3-like: the response opens with <think>, then thinks in a loop ("ab ab ..."), never closing
    ab = tok(" ab", add_special_tokens=False)["input_ids"]
    newline = tok("\n", add_special_tokens=False)["input_ids"]  # the last token of the forced "\n</think>\n\n"
    table = transitions(tok, [[question[-1], "<think>", *ab, *ab], [*newline, "The answer is 5.", tok.eos_token_id]])
    script_weights(policy, table, strength=12.0)
    rollout = policy.sample({"prompt": ["What is 2+3?"]}, 1, SamplingConfig(do_sample=False, max_new_tokens=40))
    text = tok.decode(rollout.response_ids[0][rollout.response_source[0] != TokenSource.PAD].tolist())
    opened = text.index("<think>") + len("<think>")
    think_tokens = tok(text[opened : text.index("\n</think>")], add_special_tokens=False)["input_ids"]
    assert len(think_tokens) == 4
    assert text.endswith("</think>\n\nThe answer is 5." + tok.eos_token)
    sources = rollout.response_source[0].tolist()
    assert sources.count(TokenSource.FORCED) == len(tok("\n</think>\n\n", add_special_tokens=False)["input_ids"])
    assert sources[: 1 + 4] == [TokenSource.SAMPLED] * 5  # "<think>" and four thinking tokens were sampled

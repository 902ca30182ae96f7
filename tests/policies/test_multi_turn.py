"""Multi-turn rollouts on a tiny Llama that calls the calculator (its weights follow a script, see
`scripted_lm.py`): exact masks, log-probs on the mixed sequence, prefix sharing, micro-batching."""

from __future__ import annotations

import pytest
import torch
from scripted_lm import script_weights, transitions

from rlvr_lightning.demos.tiny_lm import tiny_llama_config
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.multiturn.tool_use import ToolUse
from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions, LoRAOptions, PromptOptions
from rlvr_lightning.rollout import TokenSource
from rlvr_lightning.tools import Calculator

PROMPTS = ["What is 2+3?", "Say ab. What is 2+3?"]  # different lengths: left padding
CALL, OBSERVATION, ANSWER = "<calculator>2+3</calculator>", "<result>5</result>", "The answer is 5."
GREEDY = SamplingConfig(do_sample=False, max_new_tokens=32)


def tool_policy(tokenizer_dir, seed=0, **kwargs):
    from rlvr_lightning.policies.hf import HFPolicy

    torch.manual_seed(seed)
    kwargs.setdefault("generation", GenerationOptions(tools=ToolUse([Calculator()])))
    policy = HFPolicy(
        model=HFModelOptions(config=tiny_llama_config(), tokenizer=str(tokenizer_dir)),
        prompt=PromptOptions(template="raw"),
        **kwargs,
    )
    tok = policy.tokenizer
    last = tok("?", add_special_tokens=False)["input_ids"][-1]
    script_weights(policy, transitions(tok, [[last, CALL], ["</result>", ANSWER, tok.eos_token_id]]))
    return policy


def enc(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_the_policy_calls_the_calculator_and_answers(tool_tokenizer_dir):
    policy = tool_policy(tool_tokenizer_dir)
    tok = policy.tokenizer
    rollout = policy.sample({"prompt": PROMPTS}, 2, GREEDY)
    call, observation, answer = enc(tok, CALL), enc(tok, OBSERVATION), enc(tok, ANSWER) + [tok.eos_token_id]
    sources = (
        [TokenSource.SAMPLED] * len(call) + [TokenSource.TOOL] * len(observation) + [TokenSource.SAMPLED] * len(answer)
    )
    for row in range(rollout.num_rows):
        assert rollout.response_ids[row].tolist() == call + observation + answer
        assert rollout.response_source[row].tolist() == sources
        assert rollout.response_mask[row].tolist() == [float(s == TokenSource.SAMPLED) for s in sources]
        assert rollout.sampling_log_probs[row][rollout.response_mask[row] == 0].eq(0).all()
    assert rollout.response_text == [CALL + OBSERVATION + ANSWER] * 4
    assert rollout.response_lengths().tolist() == [float(len(sources))] * 4
    assert rollout.num_turns().tolist() == [2] * 4
    stats = policy.last_generation_stats
    assert (
        stats["tool_calls/mean"] == 1.0 and stats["turns/mean"] == 2.0 and stats["response_length/mean"] == len(sources)
    )
    assert stats["tool_errors"] == 0.0 and stats["tool_seconds"] >= 0.0


def plain_forward_log_probs(policy, rollout, temperature=1.0):
    """Reference: each row's unpadded prompt + response in one plain forward, log-softmax of every position."""
    rows = []
    with torch.no_grad():
        for r in range(rollout.num_rows):
            prompt = rollout.prompt_ids[r][rollout.prompt_mask[r].bool()]
            length = int(rollout.response_lengths()[r])
            ids = torch.cat([prompt, rollout.response_ids[r, :length]]).unsqueeze(0)
            logits = policy.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
            picked = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :].unsqueeze(-1)).squeeze(-1)
            full = torch.zeros(rollout.response_ids.shape[1])
            full[:length] = picked
            rows.append(full * rollout.response_mask[r])
    return torch.stack(rows)


def without_observations(rollout):
    """The same sampled tokens with the observations taken out of the context."""
    keep = rollout.response_source != TokenSource.TOOL
    rows = [rollout.response_ids[r][keep[r]] for r in range(rollout.num_rows)]
    masks = [rollout.response_mask[r][keep[r]] for r in range(rollout.num_rows)]
    ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
    mask = torch.nn.utils.rnn.pad_sequence(masks, batch_first=True)
    import dataclasses

    return dataclasses.replace(rollout, response_ids=ids, response_mask=mask, response_source=None)


def test_log_probs_on_the_mixed_sequence_equal_a_plain_forward(tool_tokenizer_dir):
    policy = tool_policy(tool_tokenizer_dir)
    torch.manual_seed(0)
    rollout = policy.sample({"prompt": PROMPTS}, 4, SamplingConfig(temperature=0.7, max_new_tokens=32))
    observed = rollout.response_source == TokenSource.TOOL
    continued = (observed.long().cummax(-1).values.bool() & (rollout.response_source == TokenSource.SAMPLED)).any(-1)
    assert continued.sum() >= 2  # rows that sampled after an observation (the script is followed loosely at T > 0)
    reference = plain_forward_log_probs(policy, rollout, temperature=0.7)
    log_probs, _ = policy.token_log_probs(rollout, temperature=0.7)
    mask = rollout.response_mask.bool()
    assert (log_probs.detach() - reference).abs().max() < 1e-5
    assert log_probs[~mask].eq(0).all()
    # our loop's log-probs of later turns were computed with the observation in the context
    assert (rollout.sampling_log_probs - reference).abs().max() < 1e-5
    # and that context matters: without the observations the answer's log-probs differ
    shifted, _ = policy.token_log_probs(without_observations(rollout), temperature=0.7)
    sampled = lambda values, m: torch.cat([values[r][m[r].bool()] for r in range(len(values))])  # noqa: E731
    stripped = without_observations(rollout)
    assert (
        sampled(shifted.detach(), stripped.response_mask) - sampled(reference, rollout.response_mask)
    ).abs().max() > 1e-3


@pytest.mark.parametrize("lora", [False, True])
def test_prefix_sharing_stays_exact_on_mixed_responses(tool_tokenizer_dir, lora):
    policy = tool_policy(tool_tokenizer_dir, **({"lora": LoRAOptions(r=4)} if lora else {}))
    torch.manual_seed(0)
    rollout = policy.sample({"prompt": PROMPTS}, 4, SamplingConfig(temperature=0.7, max_new_tokens=24))
    assert (rollout.response_mask == 0).logical_and(rollout.response_source != TokenSource.PAD).any()
    rollout = rollout.select(torch.randperm(rollout.num_rows))
    params = [p for p in policy.parameters() if p.requires_grad]

    def run(share):
        policy.share_prompt_prefix = share
        policy.zero_grad(set_to_none=True)
        log_probs, entropy = policy.token_log_probs(rollout, with_entropy=True)
        ((log_probs * rollout.response_mask).sum() + (entropy * rollout.response_mask).sum()).backward()
        return log_probs.detach(), entropy.detach(), [p.grad.clone() for p in params]

    calls = []
    original = policy.model.forward
    policy.model.forward = lambda *a, **k: calls.append(k["input_ids"].shape[0]) or original(*a, **k)
    shared = run(True)
    assert calls == [len(PROMPTS), rollout.num_rows]  # prompts once, then the mixed responses on their caches
    policy.model.forward = original
    joint = run(False)
    assert (shared[0] - joint[0]).abs().max() < 1e-5
    assert (shared[1] - joint[1]).abs().max() < 1e-4
    assert shared[1][rollout.response_mask == 0].eq(0).all()  # no entropy on observations or padding
    for a, b in zip(shared[2], joint[2], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_observation_tokens_get_no_gradient(tool_tokenizer_dir):
    """Changing what the loss would see at observation positions changes nothing: they are masked out."""
    policy = tool_policy(tool_tokenizer_dir)
    rollout = policy.sample({"prompt": PROMPTS[:1]}, 2, GREEDY)
    log_probs, _ = policy.token_log_probs(rollout)
    weights = torch.where(rollout.response_source == TokenSource.TOOL, 1e6, 1.0)
    policy.zero_grad(set_to_none=True)
    (log_probs * weights).sum().backward()
    with_weights = [p.grad.clone() for p in policy.parameters()]
    policy.zero_grad(set_to_none=True)
    log_probs, _ = policy.token_log_probs(rollout)
    log_probs.sum().backward()
    for a, b in zip(with_weights, [p.grad for p in policy.parameters()], strict=True):
        torch.testing.assert_close(a, b)


def test_our_loop_caps_each_prompt_on_its_own(tool_tokenizer_dir):
    """The backend hook segmented generation needs: rows continue with different budgets left."""
    from rlvr_lightning.generation.loop import KVCacheGeneration

    policy = tool_policy(tool_tokenizer_dir, generation=GenerationOptions())
    ids, _ = policy.encode_prompts(["ab", "The quick brown fox"])
    out = KVCacheGeneration().generate(
        policy.model, policy.tokenizer, ids, 2, SamplingConfig(max_new_tokens=6, min_new_tokens=1),
        eos_token_ids=[], pad_token_id=policy.pad_token_id, max_new_tokens=[2, 5],
    )  # fmt: skip
    assert out.response_mask.sum(-1).tolist() == [2, 2, 5, 5]
    assert out.truncated.all()

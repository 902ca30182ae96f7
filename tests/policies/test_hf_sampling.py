"""HFPolicy.sample on a tiny random Llama with a tokenizer trained in the test (nothing downloaded): shapes,
seeds, EOS and truncation, stop strings, greedy decoding, and the log-probs the loop returns."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.demos.tiny_lm import EOS, bias_tokens, tiny_llama_config
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions, LoRAOptions, PromptOptions
from tests.policies.comparisons import masked_max_diff

PROMPTS = ["What is 2+3?", "Hi", "Think step by step, then answer: what is the sum of 7 and 12?"]

# ---------------------------------------------------------------- sampling


def test_sample_shapes_groups_and_left_padding(make_policy):
    policy = make_policy()
    metadata = [{"answer": "5"}, {"answer": "hi"}, {"answer": "19"}]
    rollout = policy.sample({"prompt": PROMPTS, "metadata": metadata}, n=4, sampling=SamplingConfig(max_new_tokens=8))

    N = len(PROMPTS) * 4
    assert rollout.num_rows == N and rollout.group_size == 4 and rollout.num_groups == 3
    assert rollout.group_index.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    P = rollout.prompt_ids.shape[1]
    assert rollout.prompt_mask.shape == (N, P) and rollout.prompt_mask.dtype == torch.long
    assert rollout.response_ids.dtype == torch.long and rollout.response_ids.shape[0] == N
    assert 1 <= rollout.response_ids.shape[1] <= 8
    assert rollout.response_mask.dtype == torch.float32
    assert rollout.response_mask.shape == rollout.response_ids.shape
    assert rollout.truncated.dtype == torch.bool and rollout.truncated.shape == (N,)
    # left padding: masks are non-decreasing along the row, pads are the pad id, the last token is real
    assert (rollout.prompt_mask.diff(dim=1) >= 0).all()
    assert (rollout.prompt_mask[:, -1] == 1).all()
    assert (rollout.prompt_ids[rollout.prompt_mask == 0] == policy.pad_token_id).all()
    lengths = rollout.prompt_mask.sum(1)
    assert lengths[4] < lengths[0] < lengths[8]  # "Hi" is shortest, the long prompt fills P
    assert lengths[8] == P
    # groups are contiguous copies of the same prompt
    for g in range(3):
        rows = slice(4 * g, 4 * g + 4)
        assert (rollout.prompt_ids[rows] == rollout.prompt_ids[4 * g]).all()
        assert rollout.prompt_text[4 * g : 4 * g + 4] == [rollout.prompt_text[4 * g]] * 4
        assert rollout.metadata[4 * g : 4 * g + 4] == [metadata[g]] * 4
    assert rollout.prompt_text[0] == "<|user|>What is 2+3?<|endoftext|><|assistant|>"
    assert len(rollout.response_text) == N and all(isinstance(t, str) for t in rollout.response_text)
    assert rollout.old_log_probs is None  # the trainer decides whether sampling log-probs serve as old ones
    assert rollout.sampling_log_probs is not None and rollout.sampling_log_probs.shape == rollout.response_ids.shape


def test_sample_is_governed_by_the_global_seed(make_policy):
    policy = make_policy()
    sampling = SamplingConfig(max_new_tokens=6)
    torch.manual_seed(123)
    first = policy.sample({"prompt": PROMPTS}, n=2, sampling=sampling)
    torch.manual_seed(123)
    second = policy.sample({"prompt": PROMPTS}, n=2, sampling=sampling)
    assert torch.equal(first.response_ids, second.response_ids)


def test_response_mask_ends_at_first_eos(make_policy):
    policy = make_policy()
    eos = policy.tokenizer.convert_tokens_to_ids(EOS)
    assert policy.eos_token_ids == [eos]
    handle = bias_tokens(policy, [eos], 4.5)  # EOS now has a sizeable probability at every step
    torch.manual_seed(0)
    max_new = 12
    rollout = policy.sample({"prompt": PROMPTS}, n=6, sampling=SamplingConfig(max_new_tokens=max_new))
    handle.remove()

    ids, mask = rollout.response_ids, rollout.response_mask
    ended, truncated_rows = 0, 0
    for row in range(rollout.num_rows):
        hits = (ids[row] == eos).nonzero().flatten()
        if len(hits):
            first = int(hits[0])
            assert mask[row, : first + 1].eq(1).all() and mask[row, first + 1 :].eq(0).all()
            assert (ids[row, first + 1 :] == policy.pad_token_id).all()
            assert not rollout.truncated[row]
            assert EOS not in rollout.response_text[row]
            ended += 1
        else:
            assert rollout.truncated[row] and mask[row].eq(1).all() and ids.shape[1] == max_new
            truncated_rows += 1
    assert ended > 0 and truncated_rows > 0  # both kinds occur with this seed
    stats = policy.last_generation_stats
    assert stats["truncated_fraction"] == pytest.approx(truncated_rows / rollout.num_rows)
    assert stats["response_length/max"] == max_new
    assert stats["response_length/min"] == mask.sum(1).min().item()


def test_all_rows_ending_stops_the_loop(make_policy):
    policy = make_policy()
    eos = policy.eos_token_ids[0]
    handle = bias_tokens(policy, [eos], 1e4)
    rollout = policy.sample({"prompt": PROMPTS}, n=2, sampling=SamplingConfig(max_new_tokens=50))
    handle.remove()
    assert rollout.response_ids.shape == (6, 1)
    assert (rollout.response_ids == eos).all() and rollout.response_mask.eq(1).all()
    assert not rollout.truncated.any()
    assert rollout.response_text == [""] * 6
    assert policy.last_generation_stats["generation_steps"] == 1


def test_truncation_flag(make_policy):
    policy = make_policy()
    handle = bias_tokens(policy, policy.eos_token_ids, -1e4)  # never EOS
    rollout = policy.sample({"prompt": PROMPTS}, n=2, sampling=SamplingConfig(max_new_tokens=7))
    handle.remove()
    assert rollout.response_ids.shape == (6, 7)
    assert rollout.truncated.all() and rollout.response_mask.eq(1).all()
    assert policy.last_generation_stats["truncated_fraction"] == 1.0


def test_greedy_decoding_when_do_sample_is_false(make_policy):
    policy = make_policy()
    greedy = SamplingConfig(max_new_tokens=6, do_sample=False, temperature=0.7)
    torch.manual_seed(1)
    first = policy.sample({"prompt": PROMPTS}, n=3, sampling=greedy)
    torch.manual_seed(2)
    second = policy.sample({"prompt": PROMPTS}, n=3, sampling=greedy)
    assert torch.equal(first.response_ids, second.response_ids)  # no randomness
    for g in range(len(PROMPTS)):
        assert (first.response_ids[3 * g : 3 * g + 3] == first.response_ids[3 * g]).all()
    # each token is the argmax of the model's next-token distribution
    log_probs, _ = policy.token_log_probs(first, temperature=0.7)
    logits, _, t = policy._forward_response(first)
    expected = logits.argmax(-1)
    mask = first.response_mask[:, :t].bool()
    assert torch.equal(first.response_ids[:, :t][mask], expected[mask])


def test_min_new_tokens_suppresses_eos(make_policy):
    policy = make_policy(generation=GenerationOptions(min_new_tokens=5))
    handle = bias_tokens(policy, policy.eos_token_ids, 1e4)  # EOS whenever it is allowed
    rollout = policy.sample({"prompt": PROMPTS}, n=2, sampling=SamplingConfig(max_new_tokens=9))
    handle.remove()
    assert rollout.response_ids.shape == (6, 6)
    assert (rollout.response_ids[:, 5] == policy.eos_token_ids[0]).all()
    assert not torch.isin(rollout.response_ids[:, :5], torch.tensor(policy.eos_token_ids)).any()
    assert rollout.response_mask.eq(1).all() and not rollout.truncated.any()
    with pytest.raises(ValueError, match="min_new_tokens=-1 is not valid: must be an integer >= 0"):
        make_policy(generation=GenerationOptions(min_new_tokens=-1))


def test_model_is_in_train_mode_without_dropout(make_policy):
    policy = make_policy(model=HFModelOptions(config=tiny_llama_config(attention_dropout=0.5)))
    assert policy.model.training
    assert all(m.attention_dropout == 0.0 for m in policy.model.modules() if hasattr(m, "attention_dropout"))
    kept = make_policy(model=HFModelOptions(config=tiny_llama_config(attention_dropout=0.5), disable_dropout=False))
    assert any(m.attention_dropout == 0.5 for m in kept.model.modules() if hasattr(m, "attention_dropout"))


def test_stop_strings(make_policy):
    policy = make_policy()
    tok = policy.tokenizer
    a, b = tok.convert_tokens_to_ids("a"), tok.convert_tokens_to_ids("b")
    handles = [bias_tokens(policy, [a, b], 6.0), bias_tokens(policy, policy.eos_token_ids, -1e4)]
    torch.manual_seed(1)
    sampling = SamplingConfig(max_new_tokens=16, stop_strings=["ab"])
    rollout = policy.sample({"prompt": PROMPTS}, n=4, sampling=sampling)
    for h in handles:
        h.remove()

    stopped = 0
    for row in range(rollout.num_rows):
        length = int(rollout.response_mask[row].sum())
        tokens = rollout.response_ids[row, :length].tolist()
        full = tok.decode(tokens, skip_special_tokens=True)
        if rollout.truncated[row]:
            assert "ab" not in full and length == 16
            continue
        stopped += 1
        # the stop string is completed by the last kept token, not earlier
        assert "ab" in full and "ab" not in tok.decode(tokens[:-1], skip_special_tokens=True)
        text = rollout.response_text[row]
        assert text.endswith("ab") and text.count("ab") == 1 and full.startswith(text)
        assert rollout.response_mask[row, length:].eq(0).all()
    assert stopped >= rollout.num_rows // 2
    assert policy.last_generation_stats["stop_string_fraction"] == pytest.approx(stopped / rollout.num_rows)


def test_generation_stats(make_policy):
    policy = make_policy()
    policy.sample({"prompt": PROMPTS[:1]}, n=3, sampling=SamplingConfig(max_new_tokens=5))
    stats = policy.last_generation_stats
    for key in (
        "response_length/mean",
        "response_length/min",
        "response_length/max",
        "truncated_fraction",
        "tokens_per_second",
        "generation_seconds",
    ):
        assert isinstance(stats[key], float)
    assert stats["generation_seconds"] > 0 and stats["tokens_per_second"] > 0
    assert stats["num_rows"] == 3


def test_sampling_restores_training_mode(make_policy):
    policy = make_policy(model=HFModelOptions(gradient_checkpointing=True), lora=LoRAOptions(r=2))
    policy.train()
    rollout = policy.sample({"prompt": PROMPTS[:2]}, n=2, sampling=SamplingConfig(max_new_tokens=5))
    assert policy.training and policy.model.training
    log_probs, _ = policy.token_log_probs(rollout)
    (log_probs * rollout.response_mask).sum().backward()
    grads = [p.grad for p in policy.parameters() if p.requires_grad]
    assert grads and all(g is not None for g in grads)


@pytest.mark.parametrize("compact", [True, False])
def test_finished_rows_dropped_or_padded_keep_log_probs_exact(make_policy, compact):
    """Rows finishing at different steps: the cache surgery (or pad feeding) leaves other rows intact."""
    from rlvr_lightning.generation.loop import generate, left_pad
    from rlvr_lightning.rollout import Rollout

    policy = make_policy(prompt=PromptOptions(template="raw"))
    policy.eval()
    handle = bias_tokens(policy, policy.eos_token_ids, 4.0)
    ids, _ = policy.encode_prompts(["a", "The quick brown fox", "What is 2+3?"])
    prompt_ids, prompt_mask = left_pad(ids, policy.pad_token_id)
    torch.manual_seed(2)
    out = generate(
        policy.model,
        prompt_ids,
        prompt_mask,
        4,
        max_new_tokens=10,
        eos_token_ids=policy.eos_token_ids,
        pad_token_id=policy.pad_token_id,
        compact=compact,
    )
    lengths = out.response_mask.sum(1)
    assert len(set(lengths.tolist())) >= 3  # rows ended at different steps
    rollout = Rollout(
        prompt_ids=prompt_ids.repeat_interleave(4, 0),
        prompt_mask=prompt_mask.repeat_interleave(4, 0),
        response_ids=out.response_ids,
        response_mask=out.response_mask,
        group_index=torch.arange(3).repeat_interleave(4),
        group_size=4,
        truncated=out.truncated,
    )
    with torch.no_grad():
        recomputed, _ = policy.token_log_probs(rollout)
    handle.remove()
    assert masked_max_diff(out.log_probs, recomputed, out.response_mask) <= 1e-5

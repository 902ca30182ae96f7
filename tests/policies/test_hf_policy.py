"""HFPolicy on a tiny random Llama with a tokenizer trained in the test (nothing downloaded): log-probs, the
reference, prompt templates and loading (sampling: `test_hf_sampling.py`)."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.demos.tiny_lm import EOS, bias_tokens, tiny_llama_config
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.policies import hf_scoring
from rlvr_lightning.policies.hf import AdapterReference, HFPolicy
from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions, LoRAOptions, PromptOptions
from rlvr_lightning.policies.prefix_sharing import prefix_sharing_default
from tests.policies.comparisons import masked_max_diff

PROMPTS = ["What is 2+3?", "Hi", "Think step by step, then answer: what is the sum of 7 and 12?"]


# ---------------------------------------------------------------- log-probs


def test_padding_invariance_of_log_probs(make_policy):
    policy = make_policy(prompt=PromptOptions(template="raw"))
    policy.eval()
    prompts = ["a", "The quick brown fox jumps over", "What is 2+3? The answer"]
    rollout = policy.sample({"prompt": prompts}, n=2, sampling=SamplingConfig(max_new_tokens=10))
    # different response lengths too: cut row 0 short
    rollout.response_mask[0, 3:] = 0
    rollout.response_ids[0, 3:] = policy.pad_token_id
    with torch.no_grad():
        batched, batched_entropy = policy.token_log_probs(rollout, with_entropy=True)
        assert batched.shape == rollout.response_ids.shape
        for row in range(rollout.num_rows):
            single_rollout = rollout.select(torch.tensor([row]))
            single, single_entropy = policy.token_log_probs(single_rollout, with_entropy=True)
            mask = rollout.response_mask[row]
            assert masked_max_diff(batched[row], single[0], mask) <= 1e-5
            assert masked_max_diff(batched_entropy[row], single_entropy[0], mask) <= 1e-5
            # and against the unpadded sequence scored directly by the model
            prompt = rollout.prompt_ids[row][rollout.prompt_mask[row].bool()]
            length = int(mask.sum())
            response = rollout.response_ids[row, :length]
            logits = policy.model(torch.cat([prompt, response])[None]).logits[0, len(prompt) - 1 : -1]
            direct = torch.log_softmax(logits.float(), -1).gather(-1, response[:, None]).squeeze(-1)
            assert (batched[row, :length] - direct).abs().max().item() <= 1e-5
        # masked positions and trimmed columns are zero
        assert batched[0, 3:].eq(0).all() and batched_entropy[0, 3:].eq(0).all()
        # extra all-pad prompt columns and all-zero response columns change nothing
        wider = rollout.select(slice(None))
        pad_cols = torch.full((rollout.num_rows, 5), policy.pad_token_id)
        wider.prompt_ids = torch.cat([pad_cols, rollout.prompt_ids], 1)
        wider.prompt_mask = torch.cat([torch.zeros_like(pad_cols), rollout.prompt_mask], 1)
        wider.response_ids = torch.cat([rollout.response_ids, pad_cols], 1)
        wider.response_mask = torch.cat([rollout.response_mask, torch.zeros(rollout.num_rows, 5)], 1)
        padded, _ = policy.token_log_probs(wider)
        assert padded.shape == (rollout.num_rows, rollout.response_ids.shape[1] + 5)
        assert (padded[:, : batched.shape[1]] - batched).abs().max().item() <= 1e-5
        assert padded[:, batched.shape[1] :].eq(0).all()


def test_sampled_log_probs_match_recomputed(make_policy):
    assert not make_policy().sampling_log_probs_exact  # our loop's: equal to float precision, recomputed by default
    policy = make_policy(generation=GenerationOptions(keep_sampling_log_probs=True))
    assert policy.sampling_log_probs_exact
    policy.eval()
    sampling = SamplingConfig(temperature=0.7, top_k=50, top_p=0.9, max_new_tokens=12)
    rollout = policy.sample({"prompt": PROMPTS}, n=3, sampling=sampling)
    sampled = rollout.sampling_log_probs
    assert sampled is not None and sampled.shape == rollout.response_ids.shape
    with torch.no_grad():
        recomputed, _ = policy.token_log_probs(rollout, temperature=0.7)
    assert masked_max_diff(sampled, recomputed, rollout.response_mask) <= 1e-5
    assert sampled[rollout.response_mask == 0].eq(0).all()


@pytest.mark.parametrize("lora", [False, True])
def test_shared_prompt_prefix_matches_the_joint_forward_with_gradients(make_policy, lora):
    """Each distinct prompt once + responses on its cache == one forward over prompt+response rows."""
    policy = make_policy(**({"lora": LoRAOptions(r=4)} if lora else {}))
    eos = policy.eos_token_ids[0]
    handle = bias_tokens(policy, [eos], 3.0)  # some rows end early: pads inside the responses
    torch.manual_seed(0)
    rollout = policy.sample({"prompt": PROMPTS}, n=4, sampling=SamplingConfig(max_new_tokens=10))
    handle.remove()
    assert 1 <= rollout.response_mask.sum(1).min() < rollout.response_mask.shape[1]
    rollout = rollout.select(torch.randperm(rollout.num_rows))  # a shuffled mini-batch
    params = [p for p in policy.parameters() if p.requires_grad]

    def run(share: bool):
        policy.share_prompt_prefix = share
        policy.zero_grad(set_to_none=True)
        log_probs, entropy = policy.token_log_probs(rollout, temperature=0.8, with_entropy=True)
        ((log_probs * rollout.response_mask).sum() + entropy.sum()).backward()
        return log_probs.detach(), entropy.detach(), [p.grad.clone() for p in params]

    calls = []
    original = policy.model.forward
    policy.model.forward = lambda *a, **k: calls.append(k["input_ids"].shape) or original(*a, **k)
    shared = run(True)
    assert [shape[0] for shape in calls] == [len(PROMPTS), rollout.num_rows]  # prompts once, then responses
    calls.clear()
    joint = run(False)
    assert len(calls) == 1
    policy.model.forward = original
    assert masked_max_diff(shared[0], joint[0], rollout.response_mask) < 1e-5
    assert masked_max_diff(shared[1], joint[1], rollout.response_mask) < 1e-4
    for a, b in zip(shared[2], joint[2], strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_rows_without_shared_prompts_use_one_forward(make_policy):
    policy = make_policy()
    rollout = policy.sample({"prompt": PROMPTS}, n=1, sampling=SamplingConfig(max_new_tokens=4))
    calls = []
    decoder = policy.base_model.get_decoder()  # the model's forward runs it; `lean_activations` runs it alone
    original = decoder.forward
    decoder.forward = lambda *a, **k: calls.append(k["input_ids"].shape) or original(*a, **k)
    policy.token_log_probs(rollout)
    decoder.forward = original
    assert len(calls) == 1


@pytest.mark.parametrize("device_shares", [True, False])
def test_prompt_prefixes_are_shared_by_default_on_a_cpu_only(make_policy, monkeypatch, device_shares):
    """`share_prompt_prefix: null` (the default) decides by device: shared on a CPU, one forward per row on a GPU
    (where a second forward doubles a launch-bound step's kernels); true and false hold on any device."""
    assert prefix_sharing_default(torch.device("cpu")) and not prefix_sharing_default(torch.device("cuda", 0))
    policy = make_policy()
    assert policy.share_prompt_prefix is None
    for choice in (True, False):
        policy.share_prompt_prefix = choice
        assert policy._shares_prefixes(torch.device("cuda")) is choice
    policy.share_prompt_prefix = None
    monkeypatch.setattr(hf_scoring, "prefix_sharing_default", lambda device: device_shares)  # as on a CPU / a GPU
    rollout = policy.sample({"prompt": PROMPTS}, n=4, sampling=SamplingConfig(max_new_tokens=4))
    calls = []
    decoder = policy.base_model.get_decoder()
    original = decoder.forward
    decoder.forward = lambda *a, **k: calls.append(k["input_ids"].shape[0]) or original(*a, **k)
    policy.token_log_probs(rollout)
    decoder.forward = original
    assert calls == ([len(PROMPTS), rollout.num_rows] if device_shares else [rollout.num_rows])


def test_temperature_changes_log_probs(make_policy):
    policy = make_policy()
    policy.eval()
    rollout = policy.sample({"prompt": PROMPTS}, n=2, sampling=SamplingConfig(max_new_tokens=6))
    with torch.no_grad():
        cold, cold_entropy = policy.token_log_probs(rollout, temperature=0.5, with_entropy=True)
        warm, warm_entropy = policy.token_log_probs(rollout, temperature=1.0, with_entropy=True)
    mask = rollout.response_mask.bool()
    assert (cold - warm)[mask].abs().min() > 0
    # a hotter softmax is flatter: higher entropy everywhere
    assert (warm_entropy[mask] > cold_entropy[mask]).all()
    assert (warm_entropy[mask] >= 0).all()
    assert (warm[mask] <= 0).all()


# ---------------------------------------------------------------- reference


def test_lora_reference_is_the_base_model_with_adapter_disabled(make_policy, tmp_path):
    base = make_policy(seed=3)
    base.save_pretrained(tmp_path / "base")
    base.eval()
    rollout = base.sample({"prompt": PROMPTS}, n=2, sampling=SamplingConfig(max_new_tokens=8))
    with torch.no_grad():
        base_log_probs, _ = base.token_log_probs(rollout)

    policy = HFPolicy(
        model=HFModelOptions(name_or_path=str(tmp_path / "base")),
        lora=LoRAOptions(r=4, alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    trainable = [name for name, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    reference = policy.create_reference()
    assert isinstance(reference, AdapterReference) and not list(reference.parameters())

    mask = rollout.response_mask
    ref_log_probs = policy.reference_log_probs(reference, rollout, temperature=1.0)
    assert masked_max_diff(ref_log_probs, base_log_probs, mask) <= 1e-5

    with torch.no_grad():  # move the adapter away from its zero init
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    policy.train()
    adapted, _ = policy.token_log_probs(rollout)
    assert masked_max_diff(adapted.detach(), base_log_probs, mask) > 1e-3
    ref_after = policy.reference_log_probs(reference, rollout, temperature=1.0)
    assert masked_max_diff(ref_after, base_log_probs, mask) <= 1e-5
    assert policy.training  # restored

    # reset the reference to the current policy: it follows the adapter, then stays put
    policy.update_reference(reference, alpha=1.0)
    policy.eval()
    with torch.no_grad():
        adapted_eval, _ = policy.token_log_probs(rollout)
    assert masked_max_diff(policy.reference_log_probs(reference, rollout, 1.0), adapted_eval, mask) <= 1e-5
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name and ".default." in name:
                param.add_(0.5)
    assert masked_max_diff(policy.reference_log_probs(reference, rollout, 1.0), adapted_eval, mask) <= 1e-5
    trainable = [name for name, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all(".default." in name for name in trainable)
    with pytest.raises(NotImplementedError):
        policy.update_reference(reference, alpha=0.5)


def test_lora_export_merges_the_trained_adapter_not_the_reference(make_policy, tmp_path):
    make_policy(seed=3).save_pretrained(tmp_path / "base")
    policy = HFPolicy(
        model=HFModelOptions(name_or_path=str(tmp_path / "base")),
        lora=LoRAOptions(r=4, alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    reference = policy.create_reference()
    policy.update_reference(reference)  # a "reference" adapter at the zero init
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name and ".default." in name:
                param.normal_(0, 0.5)
    policy.eval()
    rollout = policy.sample({"prompt": PROMPTS}, n=2, sampling=SamplingConfig(max_new_tokens=6))
    with torch.no_grad():
        adapted, _ = policy.token_log_probs(rollout)
    policy.save_pretrained(tmp_path / "merged")
    merged = HFPolicy(model=HFModelOptions(name_or_path=str(tmp_path / "merged")))
    merged.eval()
    with torch.no_grad():
        exported, _ = merged.token_log_probs(rollout)
    assert masked_max_diff(exported, adapted, rollout.response_mask) <= 1e-5
    assert "reference" in policy.model.peft_config  # the policy itself keeps both adapters


def test_full_reference_copy(make_policy):
    policy = make_policy()
    policy.eval()
    rollout = policy.sample({"prompt": PROMPTS[:2]}, n=2, sampling=SamplingConfig(max_new_tokens=6))
    reference = policy.create_reference()
    assert reference.tokenizer is policy.tokenizer
    assert not any(p.requires_grad for p in reference.parameters())
    mask = rollout.response_mask
    with torch.no_grad():
        own, _ = policy.token_log_probs(rollout)
        for p in policy.parameters():
            p.add_(0.01 * torch.randn_like(p))
        moved, _ = policy.token_log_probs(rollout)
    assert masked_max_diff(policy.reference_log_probs(reference, rollout, 1.0), own, mask) <= 1e-6
    policy.update_reference(reference)
    assert masked_max_diff(policy.reference_log_probs(reference, rollout, 1.0), moved, mask) <= 1e-6


# ---------------------------------------------------------------- prompts and loading


def test_prompt_templates(make_policy):
    chat = make_policy(prompt=PromptOptions(system_prompt="Be brief."))
    assert chat.render_prompt("Hi") == "<|system|>Be brief.<|endoftext|><|user|>Hi<|endoftext|><|assistant|>"
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert chat.render_prompt(messages) == "<|system|>S<|endoftext|><|user|>U<|endoftext|><|assistant|>"
    raw = make_policy(prompt=PromptOptions(template="raw"))
    assert raw.render_prompt("Hi {x}") == "Hi {x}"
    formatted = make_policy(prompt=PromptOptions(template="Q: {prompt}\nA:"))
    assert formatted.render_prompt("2+3?") == "Q: 2+3?\nA:"
    rollout = formatted.sample({"prompt": ["2+3?", [5, 6, 7]]}, n=1, sampling=SamplingConfig(max_new_tokens=2))
    assert rollout.prompt_text[0] == "Q: 2+3?\nA:"
    assert rollout.prompt_ids[1, -3:].tolist() == [5, 6, 7]
    with pytest.raises(ValueError, match="system_prompt"):
        make_policy(prompt=PromptOptions(template="raw", system_prompt="x"))
    with pytest.raises(ValueError, match="prompt.template"):
        make_policy(prompt=PromptOptions(template="no placeholder"))


def test_load_from_local_directory(make_policy, tmp_path):
    policy = make_policy(seed=5)
    policy.save_pretrained(tmp_path / "model")
    loaded = HFPolicy(
        model=HFModelOptions(name_or_path=str(tmp_path / "model"), dtype="float32", attn_implementation="eager")
    )
    for (name, a), (_, b) in zip(policy.named_parameters(), loaded.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    bf16 = HFPolicy(model=HFModelOptions(name_or_path=str(tmp_path / "model"), dtype="bfloat16"))
    assert next(bf16.parameters()).dtype == torch.bfloat16
    rollout = bf16.sample({"prompt": PROMPTS[:1]}, n=2, sampling=SamplingConfig(max_new_tokens=4))
    log_probs, _ = bf16.token_log_probs(rollout)
    assert log_probs.dtype == torch.float32 and torch.isfinite(log_probs).all()


def test_built_from_yaml_with_jsonargparse(tokenizer_dir):
    from jsonargparse import ArgumentParser

    from rlvr_lightning.policies.base import Policy

    parser = ArgumentParser()
    parser.add_subclass_arguments(Policy, "policy")
    yaml = f"""
policy:
  class_path: rlvr_lightning.policies.HFPolicy
  init_args:
    model:
      config: {{model_type: llama, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1,
                num_attention_heads: 2, max_position_embeddings: 128}}
      tokenizer: {tokenizer_dir}
    lora:
      r: 2
      target_modules: [q_proj]
    prompt:
      template: "Q: {{prompt}} A:"
"""
    cfg = parser.parse_string(yaml)
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes
    policy = instantiate(cfg).policy
    assert isinstance(policy, HFPolicy) and policy.lora_r == 2
    assert policy.hf_config.hidden_size == 32 and policy.max_context == 128


# ---------------------------------------------------------------- bad input


def test_missing_model_path_names_it(tmp_path):
    missing = tmp_path / "no_such_model"
    with pytest.raises(FileNotFoundError, match="no_such_model"):
        HFPolicy(model=HFModelOptions(name_or_path=str(missing)))


def test_unfetched_alias_names_the_fetch_command(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="rlvr-models fetch smollm2-135m-instruct"):
        HFPolicy(model=HFModelOptions(name_or_path="smollm2-135m-instruct"))


def test_unknown_bare_name_mentions_aliases(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a known model alias") as info:
        HFPolicy(model=HFModelOptions(name_or_path="smollm2-135m-instruckt"))
    assert "smollm2-135m-instruckt" in str(info.value)


def test_gguf_with_unsupported_architecture(tmp_path):
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path / "weird.gguf"
    writer = GGUFWriter(str(path), arch="frobnicator")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="architecture 'frobnicator'.*cannot load"):
        HFPolicy(model=HFModelOptions(gguf_file=str(path)))
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        HFPolicy(model=HFModelOptions(gguf_file=str(tmp_path / "nope.gguf")))


def test_prompt_longer_than_context(make_policy):
    policy = make_policy(
        model=HFModelOptions(config=tiny_llama_config(max_position_embeddings=40)), prompt=PromptOptions(template="raw")
    )
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 4
    n_tokens = len(policy.tokenizer(long_prompt)["input_ids"])
    with pytest.raises(ValueError, match=rf"prompt 1 of the batch is {n_tokens} tokens long") as info:
        policy.sample({"prompt": ["short", long_prompt]}, n=2, sampling=SamplingConfig(max_new_tokens=8))
    assert "32" in str(info.value)  # how many prompt tokens would fit


def test_tokenizer_without_pad_token_uses_eos(tmp_path):
    from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer

    tokenizer_dir = save_tiny_tokenizer(tmp_path / "nopad", with_pad=False)
    with pytest.warns(UserWarning, match="no pad token"):
        policy = HFPolicy(model=HFModelOptions(config=tiny_llama_config(), tokenizer=str(tokenizer_dir)))
    eos = policy.tokenizer.convert_tokens_to_ids(EOS)
    assert policy.pad_token_id == eos == policy.tokenizer.pad_token_id
    rollout = policy.sample({"prompt": PROMPTS}, n=2, sampling=SamplingConfig(max_new_tokens=5))
    assert (rollout.prompt_ids[rollout.prompt_mask == 0] == eos).all()
    log_probs, _ = policy.token_log_probs(rollout)
    assert torch.isfinite(log_probs).all()


def test_chat_template_required_for_chat_prompts(tmp_path):
    from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer

    tokenizer_dir = save_tiny_tokenizer(tmp_path / "nochat", chat_template=False)
    policy = HFPolicy(model=HFModelOptions(config=tiny_llama_config(), tokenizer=str(tokenizer_dir)))
    with pytest.raises(ValueError, match="no chat template"):
        policy.sample({"prompt": ["Hi"]}, n=1, sampling=SamplingConfig(max_new_tokens=2))


def test_a_backend_given_as_the_generation_group_is_a_clear_error(make_policy):
    from rlvr_lightning.generation import KVCacheGeneration

    with pytest.raises(
        TypeError, match=r"HFPolicy generation= takes a GenerationOptions, got KVCacheGeneration: e\.g\."
    ):
        make_policy(generation=KVCacheGeneration())

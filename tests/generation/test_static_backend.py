"""`StaticCacheGeneration` as a policy's backend: the rollouts of `HFPolicy.sample` (a real tokenizer's stop strings,
the thinking budget's segments, LoRA, a bf16 sampling copy) equal those of our eager loop kept without compaction;
its options are checked; `DeviceDefaultGeneration` is the eager loop on a CPU."""

from __future__ import annotations

import warnings

import pytest
import torch

from rlvr_lightning.demos.tiny_lm import bias_tokens, tiny_llama_config
from rlvr_lightning.generation import DeviceDefaultGeneration, KVCacheGeneration, StaticCacheGeneration
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.multiturn.thinking_budget import ThinkingBudget
from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions, LoRAOptions, PromptOptions
from rlvr_lightning.runtime.option_domains import OptionValueError

PROMPTS = {"prompt": ["What is 2+3?", "The quick brown fox", "Say ab."]}


def rollouts(make_policy, backends, sampling, seed=1, **kwargs):
    """One rollout per backend from policies with the same weights and the same random stream."""
    out = []
    for backend in backends:
        policy = make_policy(
            generation=GenerationOptions(backend=backend), prompt=PromptOptions(template="raw"), **kwargs
        )
        torch.manual_seed(seed)
        out.append(policy.sample(PROMPTS, 3, sampling))
    return out


def assert_same_rollout(a, b, log_prob_tolerance: float = 1e-5) -> None:
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)
    assert torch.equal(a.truncated, b.truncated) and a.response_text == b.response_text
    assert (a.sampling_log_probs - b.sampling_log_probs).abs().max() <= log_prob_tolerance
    assert (a.response_source is None) == (b.response_source is None)
    if a.response_source is not None:
        assert torch.equal(a.response_source, b.response_source)


def test_stop_strings_of_a_real_tokenizer(make_policy, eager_without_compaction):
    sampling = SamplingConfig(max_new_tokens=20, stop_strings=["e", "fox"], temperature=0.9)
    eager, static = rollouts(make_policy, [KVCacheGeneration(), StaticCacheGeneration(sync_every=6)], sampling)
    assert_same_rollout(eager, static)
    stopped = [text for text in static.response_text if text.endswith(("e", "fox"))]
    assert stopped and len(stopped) < len(static.response_text)  # some rows stopped, some did not


def test_thinking_budget_segments(tool_tokenizer_dir, make_policy, eager_without_compaction):
    """Round 0 stops at the budget (the model never closes its thinking, nor ends); later rounds continue each row
    with its own cap (n=1)."""
    outs = []
    for backend in (KVCacheGeneration(), StaticCacheGeneration(sync_every=4)):
        budget = ThinkingBudget(max_thinking_tokens=5, forced_text="\n</think>\n")
        policy = make_policy(
            generation=GenerationOptions(backend=backend, thinking_budget=budget),
            model=HFModelOptions(tokenizer=str(tool_tokenizer_dir)),
            prompt=PromptOptions(template="{prompt} <think>"),
        )
        tok = policy.tokenizer
        bias_tokens(policy, [tok.eos_token_id, tok.convert_tokens_to_ids("</think>")], float("-inf"))
        torch.manual_seed(1)
        outs.append(policy.sample(PROMPTS, 3, SamplingConfig(max_new_tokens=24)))
    assert (outs[1].response_mask == 0).any()  # the close was forced
    assert_same_rollout(*outs)


def test_lora_policy(make_policy, eager_without_compaction):
    sampling = SamplingConfig(max_new_tokens=12)
    eager, static = rollouts(
        make_policy, [KVCacheGeneration(), StaticCacheGeneration()], sampling, lora=LoRAOptions(r=4)
    )
    assert_same_rollout(eager, static)


def test_a_bf16_copy_is_refreshed_in_place_for_the_compiled_step(make_policy, eager_without_compaction):
    """bf16 sampling from fp32 weights: the copy's parameters keep their storage when the weights change, so the
    compiled step (and a CUDA graph) keeps reading them; it samples as the eager loop's copy before and after."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    eager_policy = make_policy(
        generation=GenerationOptions(backend=KVCacheGeneration(dtype="bfloat16")), prompt=PromptOptions(template="raw")
    )
    backend = StaticCacheGeneration(dtype="bfloat16", compile="aot_eager")
    policy = make_policy(generation=GenerationOptions(backend=backend), prompt=PromptOptions(template="raw"))
    sampling = SamplingConfig(max_new_tokens=10)
    for update in range(2):
        outs = []
        for each in (eager_policy, policy):
            torch.manual_seed(update)
            outs.append(each.sample(PROMPTS, 2, sampling))
        assert_same_rollout(*outs, log_prob_tolerance=1e-2)  # bf16 rounding: the tokens are the same
        copy = next(iter(backend._weights._copies.values()))[1]
        pointers = [p.data_ptr() for p in copy.parameters()]
        with torch.no_grad():
            for each in (eager_policy, policy):
                for p in each.parameters():
                    p.mul_(1.1)  # an update of every weight
        policy.sample(PROMPTS, 2, SamplingConfig(max_new_tokens=2))  # refreshes the copy
        assert [p.data_ptr() for p in copy.parameters()] == pointers
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    torch._dynamo.reset()


def test_the_default_backend_is_the_eager_loop_on_a_cpu(make_policy):
    default = make_policy(prompt=PromptOptions(template="raw"))
    assert isinstance(default.generation, DeviceDefaultGeneration)
    (eager,) = rollouts(make_policy, [KVCacheGeneration()], SamplingConfig(max_new_tokens=16))
    torch.manual_seed(1)
    assert_same_rollout(eager, default.sample(PROMPTS, 3, SamplingConfig(max_new_tokens=16)))  # with compaction
    assert not default.generation._static._workspaces._by_model


def test_the_default_backend_decodes_statically_on_cuda_where_the_model_allows(make_policy):
    from transformers import AutoConfig, AutoModelForCausalLM

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    model = make_policy().model
    config = tiny_llama_config(vocab_size=64, model_type="mistral", sliding_window=16)
    windowed = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    assert DeviceDefaultGeneration.decodes_statically(cuda, model)
    assert not DeviceDefaultGeneration.decodes_statically(cpu, model)
    assert not DeviceDefaultGeneration.decodes_statically(cuda, windowed)


def test_bad_options_name_the_option_and_the_choices(make_policy):
    with pytest.raises(ValueError, match=r"compile='fast' is not valid; choose one of \['auto', 'none', 'aot_eager'"):
        StaticCacheGeneration(compile="fast")
    with pytest.raises(OptionValueError, match="sync_every"):
        StaticCacheGeneration(sync_every=0)
    with pytest.raises(ValueError, match="StaticCacheGeneration dtype='fp8' is not valid"):
        StaticCacheGeneration(dtype="fp8")
    policy = make_policy(
        generation=GenerationOptions(backend=StaticCacheGeneration(compile="reduce-overhead")),
        prompt=PromptOptions(template="raw"),
    )
    with pytest.raises(ValueError, match="compile='reduce-overhead' needs a CUDA device; the model is on cpu"):
        policy.sample(PROMPTS, 1, SamplingConfig(max_new_tokens=4))


def test_a_model_with_sliding_window_layers_is_refused_before_decoding(make_policy):
    config = tiny_llama_config(model_type="mistral", sliding_window=16)
    policy = make_policy(
        model=HFModelOptions(config=config),
        generation=GenerationOptions(backend=StaticCacheGeneration()),
        prompt=PromptOptions(template="raw"),
    )
    with pytest.raises(ValueError, match="StaticCacheGeneration cannot decode this model: MistralForCausalLM has"):
        policy.sample(PROMPTS, 1, SamplingConfig(max_new_tokens=4))


def test_a_transformers_without_a_device_length_counter_decodes_eagerly(make_policy, monkeypatch):
    """transformers < 5.4 counts a `StaticLayer`'s length on the host (no `cumulative_length` tensor): the default
    backend keeps the eager loop on CUDA, and `StaticCacheGeneration` refuses with the reason before decoding."""
    from transformers.cache_utils import StaticLayer

    original = StaticLayer.__init__

    def host_counting_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        del self.cumulative_length

    model = make_policy().model
    assert DeviceDefaultGeneration.decodes_statically(torch.device("cuda", 0), model)
    monkeypatch.setattr(StaticLayer, "__init__", host_counting_init)
    assert not DeviceDefaultGeneration.decodes_statically(torch.device("cuda", 0), model)
    backend = DeviceDefaultGeneration()
    backend.say_why_eager(torch.device("cpu"), model)  # the eager loop is a CPU's default: nothing to say
    with pytest.warns(UserWarning, match=r"decodes eagerly on cuda:0, not statically: .*transformers >= 5\.4"):
        backend.say_why_eager(torch.device("cuda", 0), model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        backend.say_why_eager(torch.device("cuda", 0), model)  # once
    policy = make_policy(
        generation=GenerationOptions(backend=StaticCacheGeneration()), prompt=PromptOptions(template="raw")
    )
    with pytest.raises(ValueError, match=r"keeps its static cache's length on the host.*transformers >= 5\.4"):
        policy.sample(PROMPTS, 1, SamplingConfig(max_new_tokens=4))


def test_under_autocast_over_float32_weights(make_policy, eager_without_compaction):
    """`bf16-mixed` with `dtype: auto`: both loops sample the float32 model under autocast (the default on a CUDA
    device), where a step's keys leave RoPE in float32 and its values their projection in bf16; the static cache
    holds each in its own dtype (transformers < 5.20 would give the values the keys')."""
    sampling = SamplingConfig(max_new_tokens=12, temperature=0.9)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager, static = rollouts(make_policy, [KVCacheGeneration(), StaticCacheGeneration(sync_every=5)], sampling)
    assert_same_rollout(eager, static, log_prob_tolerance=1e-2)  # the same tokens; bf16 rounding in other orders


def test_the_static_cache_holds_keys_and_values_in_the_autocast_dtype():
    from rlvr_lightning.generation.static_cache import DecodeWorkspace

    from .static_pairs import tiny_model

    model = tiny_model()
    keys = torch.zeros(1, 2, 3, 8)  # a prefill's float32 keys and values (transformers < 5.20 promotes both)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer = DecodeWorkspace(model, 4, 64, keys, keys.clone()).cache.layers[0]
    assert (layer.keys.dtype, layer.values.dtype) == (torch.bfloat16, torch.bfloat16)
    layer = DecodeWorkspace(model, 4, 64, keys, keys.clone()).cache.layers[0]
    assert (layer.keys.dtype, layer.values.dtype) == (torch.float32, torch.float32)


def test_a_sharded_model_decodes_eagerly_on_cuda_and_the_default_says_why(make_policy):
    """FSDP2 gathers a sharded model's weights into new storage for every rollout, which a captured graph would not
    follow: the default backend keeps the eager loop there, and says so once."""
    from torch.distributed.fsdp import FSDPModule

    model = make_policy().model
    cuda = torch.device("cuda", 0)
    assert DeviceDefaultGeneration.why_eager(cuda, model) is None
    layer = model.get_decoder().layers[0]
    layer.__class__ = type("FSDPLlamaDecoderLayer", (FSDPModule, type(layer)), {})  # what fully_shard does
    assert DeviceDefaultGeneration.why_eager(cuda, model).startswith("the model is sharded by FSDP2")
    assert not DeviceDefaultGeneration.decodes_statically(cuda, model)
    with pytest.warns(UserWarning, match=r"decodes eagerly on cuda:0, not statically: the model is sharded by FSDP2"):
        DeviceDefaultGeneration().say_why_eager(cuda, model)


def test_under_autocast_the_cache_keeps_bf16_keys_and_samples_as_with_fp32_keys(make_policy, monkeypatch):
    """Keys leave RoPE in fp32 under autocast; the static cache keeps them in bf16, the rounding SDPA's autocast
    applies to them anyway: the same tokens and bit-identical log-probs as a cache that keeps them in fp32."""
    from rlvr_lightning.generation import static_cache

    def sample(backend):
        policy = make_policy(generation=GenerationOptions(backend=backend), prompt=PromptOptions(template="raw"))
        torch.manual_seed(1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            rollout = policy.sample(PROMPTS, 3, SamplingConfig(max_new_tokens=12, temperature=0.9))
        (workspaces,) = [workspaces for _, workspaces in backend._workspaces._by_model.values()]
        return rollout, next(iter(workspaces.values())).cache.layers[0]

    bf16_keys, layer = sample(StaticCacheGeneration())
    assert layer.keys.dtype == layer.values.dtype == torch.bfloat16
    monkeypatch.setattr(static_cache, "step_cache_dtype", lambda like: like.dtype)
    fp32_keys, layer = sample(StaticCacheGeneration())
    assert layer.keys.dtype == torch.float32
    assert torch.equal(bf16_keys.response_ids, fp32_keys.response_ids)
    assert torch.equal(bf16_keys.sampling_log_probs, fp32_keys.sampling_log_probs)


def test_the_random_stream_of_cuda_0_is_device_0s_generator(monkeypatch):
    from rlvr_lightning.generation.static_generation import RandomStream

    generators = (torch.Generator(), torch.Generator())
    monkeypatch.setattr(torch.cuda, "default_generators", generators)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)  # a thread whose current device is cuda:1
    assert RandomStream(None, torch.device("cuda", 0)).generator is generators[0]
    assert RandomStream(None, torch.device("cuda")).generator is generators[1]

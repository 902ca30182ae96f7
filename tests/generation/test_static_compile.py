"""The static decoding step compiles as one graph (`torch.compile(fullgraph=True)`, here with the `aot_eager`
backend, which runs the traced graph with torch's own operators) and samples what the eager loop samples; prompts
of another length replay the same graph."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.generation.static_cache import WorkspacePool

from .static_pairs import assert_same, run_pair, tiny_model


def test_the_compiled_step_is_one_graph_and_samples_as_the_eager_loop(compile_counts):
    model, pool = tiny_model("llama"), WorkspacePool()
    sampling = SamplingConfig(max_new_tokens=24, temperature=0.8, min_new_tokens=3)
    assert_same(run_pair(model, sampling, caps=[24, 3, 17], stop_strings=("dd",), mode="aot_eager", pool=pool))
    assert compile_counts["stats"]["unique_graphs"] == 1 and not compile_counts["graph_break"]
    longer = [[5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15]]
    assert_same(run_pair(model, sampling, prompts=longer, mode="aot_eager", pool=pool, seed=5))
    assert compile_counts["stats"]["unique_graphs"] == 1  # the same graph, not a recompilation


def test_filtered_sampling_compiles_as_one_graph(compile_counts):
    sampling = SamplingConfig(max_new_tokens=12, top_k=12, top_p=0.95, min_p=0.3, temperature=0.3)
    assert_same(run_pair(tiny_model("llama"), sampling, mode="aot_eager"))
    assert compile_counts["stats"]["unique_graphs"] == 1 and not compile_counts["graph_break"]


def test_greedy_decoding_compiles_its_own_graph(compile_counts):
    pair = run_pair(tiny_model("qwen2"), SamplingConfig(max_new_tokens=12, do_sample=False), mode="aot_eager")
    assert_same(pair)
    assert compile_counts["stats"]["unique_graphs"] == 1 and not compile_counts["graph_break"]


def test_the_default_decodes_eagerly_after_its_compiler_failed(make_policy, monkeypatch, compile_counts):
    """`compile="auto"` whose compiler fails warns, samples what the eager step samples from the same random state,
    and does not try again; a compile mode named in the config raises the compiler's error."""
    from rlvr_lightning.generation import StaticCacheGeneration, static_generation, step_capture
    from rlvr_lightning.policies.hf_options import GenerationOptions, PromptOptions

    calls = []

    def failing_backend(graph, example_inputs):
        calls.append(graph)
        raise RuntimeError("no working compiler here")

    def failing_compile(step, mode):
        return torch.compile(step, fullgraph=True, dynamic=False, backend=failing_backend)

    monkeypatch.setattr(static_generation, "resolve_compile_mode", lambda mode, device: mode.replace("auto", "default"))
    monkeypatch.setattr(step_capture, "compiled", failing_compile)
    prompts, sampling = {"prompt": ["What is 2+3?", "Say ab."]}, SamplingConfig(max_new_tokens=12, temperature=0.9)

    def sample(backend):
        policy = make_policy(generation=GenerationOptions(backend=backend), prompt=PromptOptions(template="raw"))
        torch.manual_seed(3)
        return policy, policy.sample(prompts, 2, sampling)

    _, eager = sample(StaticCacheGeneration(compile="none"))
    with pytest.warns(UserWarning, match=r"compiling the decoding step \('default'\) failed, so it runs eagerly"):
        policy, fell_back = sample(StaticCacheGeneration())
    assert torch.equal(fell_back.response_ids, eager.response_ids) and fell_back.response_text == eager.response_text
    assert torch.equal(fell_back.sampling_log_probs, eager.sampling_log_probs)
    assert len(calls) == 1
    policy.sample(prompts, 2, sampling)
    assert len(calls) == 1  # decoded eagerly, without compiling again
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="no working compiler here"):
        sample(StaticCacheGeneration(compile="default"))


def test_a_cuda_devices_default_falls_back_to_a_cuda_graph_then_to_the_eager_step(make_policy, monkeypatch):
    """On a CUDA device `auto` compiles the forward inside a CUDA graph; a failed compiler leaves the step to a CUDA
    graph of the eager step (no compiler), and a failed capture to the eager step; each fallback warns once, and the
    next generation starts at the mode that worked."""
    from rlvr_lightning.generation import StaticCacheGeneration, static_generation, step_capture
    from rlvr_lightning.policies.hf_options import GenerationOptions, PromptOptions

    tried, real = [], static_generation.static_generate

    def generate_or_fail(*args, mode, **kwargs):  # the compiler and the capture fail on this "CUDA device"
        tried.append(mode)
        if mode == "reduce-overhead":
            raise torch._dynamo.exc.TorchDynamoException("no working Triton")
        if mode == "compiled-forward":
            raise step_capture.CaptureFailed("the compiled forward failed in its warm-up: no kernel")
        if mode == "cuda-graph":
            raise step_capture.CaptureFailed("capturing the decoding step in a CUDA graph failed: not capturable")
        return real(*args, mode=mode, **kwargs)

    monkeypatch.setattr(
        static_generation, "resolve_compile_mode", lambda mode, device: mode.replace("auto", "compiled-forward")
    )
    monkeypatch.setattr(
        static_generation,
        "fallback_mode",
        lambda failed, device: step_capture.fallback_mode(failed, torch.device("cuda")),
    )
    monkeypatch.setattr(static_generation, "static_generate", generate_or_fail)
    prompts, sampling = {"prompt": ["What is 2+3?", "Say ab."]}, SamplingConfig(max_new_tokens=12, temperature=0.9)
    policy = make_policy(
        generation=GenerationOptions(backend=StaticCacheGeneration()), prompt=PromptOptions(template="raw")
    )
    eager_policy = make_policy(
        generation=GenerationOptions(backend=StaticCacheGeneration(compile="none")),
        prompt=PromptOptions(template="raw"),
    )
    torch.manual_seed(3)
    eager = eager_policy.sample(prompts, 2, sampling)
    tried.clear()
    torch.manual_seed(3)
    with pytest.warns(UserWarning) as caught:
        fell_back = policy.sample(prompts, 2, sampling)
    messages = [str(w.message) for w in caught if "StaticCacheGeneration" in str(w.message)]
    assert tried == ["compiled-forward", "cuda-graph", "none"]
    assert "('compiled-forward') failed, so it runs as a CUDA graph of the eager step" in messages[0]
    assert "capturing the decoding step ('cuda-graph') failed, so it runs eagerly" in messages[1]
    assert len(messages) == 2
    assert torch.equal(fell_back.response_ids, eager.response_ids)
    assert torch.equal(fell_back.sampling_log_probs, eager.sampling_log_probs)
    policy.sample(prompts, 2, sampling)
    assert tried[3:] == ["none"]


def test_the_fallback_after_a_failed_compiler_is_a_cuda_graph_on_a_cuda_device_only():
    from rlvr_lightning.generation.step_capture import fallback_mode

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    failed = ("reduce-overhead", "default", "compiled-forward", "cuda-graph")
    assert [fallback_mode(mode, cuda) for mode in failed] == ["cuda-graph", "cuda-graph", "cuda-graph", "none"]
    assert [fallback_mode(mode, cpu) for mode in ("reduce-overhead", "default", "aot_eager")] == ["none"] * 3


def test_a_graph_is_captured_without_the_autocast_cache():
    """Under `bf16-mixed` autocast caches its cast of each weight; a graph captured on the cached copy would go on
    reading it after the cache is cleared (freed memory) and miss in-place updates. The capture runs uncached: its
    casts read the weights as they are now."""
    from rlvr_lightning.generation.step_capture import uncached_autocast

    linear, x = torch.nn.Linear(8, 8), torch.randn(2, 8)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        linear(x)  # the cache now holds the bf16 weight
        linear.weight.mul_(2.0)  # an update in place
        stale = linear(x)
        with uncached_autocast("cpu"):
            fresh = linear(x)
            assert torch.is_autocast_enabled("cpu") and not torch.is_autocast_cache_enabled()
        assert torch.is_autocast_cache_enabled()
    expected = torch.nn.functional.linear(x.bfloat16(), linear.weight.bfloat16(), linear.bias.bfloat16())
    assert torch.equal(fresh, expected) and not torch.equal(stale, expected)
    with uncached_autocast("cpu"):
        assert not torch.is_autocast_enabled("cpu")  # no autocast where the caller had none


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("CUDA error: operation not permitted when stream is capturing"),
        torch._dynamo.exc.FailOnRecompileLimitHit("recompile_limit reached with fullgraph=True"),
    ],
    ids=["recording", "recompile_limit"],
)
def test_a_compiled_step_failing_in_its_first_calls_is_a_failed_capture(monkeypatch, error):
    """`compile: auto` falls back on `CaptureFailed`: any failure of a compiled step's first calls (compilation,
    inductor's recording) becomes one; memory running out does not, nor a failure after them."""
    from rlvr_lightning.generation import step_capture

    raised = [error]

    def graph():
        if raised:
            raise raised.pop()

    monkeypatch.setattr(torch, "compile", lambda step, **options: graph)
    run = step_capture.compiled(lambda: None, "default")
    with pytest.raises(step_capture.CaptureFailed, match="failed in its first calls") as caught:
        run()
    assert caught.value.__cause__ is error
    raised.append(torch.OutOfMemoryError("CUDA out of memory"))
    with pytest.raises(torch.OutOfMemoryError):
        run()
    for _ in range(step_capture.RECORDING_CALLS):
        run()
    raised.append(RuntimeError("a later failure"))
    with pytest.raises(RuntimeError, match="a later failure") as later:
        run()
    assert type(later.value) is RuntimeError


def test_inductor_keeps_the_modes_options_and_its_reductions_whole():
    """The compiled step's reductions over the vocabulary stay whole (a split softmax failed to compile on torch 2.11
    with CUDA at 128 rows of a 49,152-token vocabulary); the mode's own options (CUDA graphs) stay."""
    from rlvr_lightning.generation.step_capture import inductor_options

    assert inductor_options("reduce-overhead") == {"triton.cudagraphs": True, "split_reductions": False}
    assert inductor_options("default") == {"split_reductions": False}

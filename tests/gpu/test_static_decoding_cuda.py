"""Static decoding on a CUDA device (`StaticCacheGeneration`): every way of running its step samples the eager
loop's tokens for the same random stream (fp32, tiny random Llama), the host synchronises at most once per
`sync_every` steps, and a policy without a named backend decodes statically. Skipped without a GPU;
`scripts/gpu_check.sh` runs them (tests/generation holds the CPU versions)."""

from __future__ import annotations

import warnings

import pytest
import torch

from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.policies.hf_options import HFModelOptions

from ..generation.static_pairs import assert_same, run_pair, static_only, tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (scripts/gpu_check.sh)")


@pytest.mark.parametrize("mode", ["none", "default", "reduce-overhead", "compiled-forward", "cuda-graph"])
def test_every_mode_samples_the_eager_loops_tokens(mode):
    """`reduce-overhead` runs its step in inductor's CUDA graphs: a skipped graph (otherwise a warning, and the
    kernels launched from Python) is an error here (tests/generation/test_static_cuda_graph_rules.py checks the
    rules a CPU can check)."""
    model = tiny_model("llama").cuda()
    sampling = SamplingConfig(max_new_tokens=24, temperature=0.8, min_new_tokens=2)
    with torch._inductor.config.patch({"triton.cudagraph_or_error": True}):
        pair = run_pair(model, sampling, caps=[24, 3, 17], stop_strings=("dd",), mode=mode, device="cuda")
        assert_same(pair, log_prob_tolerance=1e-4)
        greedy = run_pair(model, SamplingConfig(max_new_tokens=12, do_sample=False), mode=mode, device="cuda")
        assert_same(greedy, log_prob_tolerance=1e-4)


def syncs_and_steps(model, pool, max_new_tokens: int, mode: str) -> tuple[int, int]:
    """Synchronisations of one static generation (EOS excluded: every row decodes `max_new_tokens`) and its steps."""
    sampling = SamplingConfig(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode(1)
        try:
            out = static_only(model, sampling, pool=pool, mode=mode, device="cuda")
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum("called a synchronizing CUDA operation" in str(w.message) for w in caught), out.steps


@pytest.mark.parametrize("mode", ["none", "reduce-overhead", "compiled-forward", "cuda-graph"])
def test_the_host_synchronises_once_per_eight_steps(mode):
    """A generation also synchronises a few times outside its loop (the prefill's mask check, its clock), the same
    in both: 32 more steps add 4 reads of the sampled tokens."""
    from rlvr_lightning.generation.static_cache import WorkspacePool

    model, pool = tiny_model("llama").cuda(), WorkspacePool()
    syncs_and_steps(model, pool, 48, mode)  # compiles or captures
    (short, short_steps), (long, long_steps) = (
        syncs_and_steps(model, pool, 8, mode),
        syncs_and_steps(model, pool, 40, mode),
    )
    assert long_steps - short_steps == 32
    assert 0 < long - short <= 4, (short, long)  # the block reads are counted


def test_a_policy_without_a_named_backend_decodes_statically(tmp_path):
    from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config
    from rlvr_lightning.policies.hf import HFPolicy

    tokenizer = str(save_tiny_tokenizer(tmp_path / "tok"))
    torch.manual_seed(0)
    policy = HFPolicy(model=HFModelOptions(config=tiny_llama_config(), tokenizer=tokenizer)).to("cuda")
    rollout = policy.sample({"prompt": ["a", "The quick brown fox"]}, n=4, sampling=SamplingConfig(max_new_tokens=16))
    assert rollout.response_ids.shape[0] == 8 and policy.generation._static._workspaces._by_model


def test_the_default_runs_a_cuda_graph_where_its_compiler_fails(tmp_path, monkeypatch):
    """`compile: auto` whose compiler fails on a CUDA device (the forward's) captures the eager
    step in a CUDA graph instead (the workspace holds it beside the steps that failed), which samples the eager
    step's tokens from the same random state."""
    from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config
    from rlvr_lightning.generation import StaticCacheGeneration, step_capture
    from rlvr_lightning.policies.hf import HFPolicy
    from rlvr_lightning.policies.hf_options import GenerationOptions, PromptOptions

    def failing_backend(graph, example_inputs):
        raise RuntimeError("no working compiler here")

    monkeypatch.setattr(
        step_capture,
        "compiled",
        lambda step, mode: torch.compile(step, fullgraph=True, dynamic=False, backend=failing_backend),
    )
    monkeypatch.setattr(
        step_capture,
        "compiled_forward",
        lambda model: torch.compile(model, fullgraph=True, dynamic=False, backend=failing_backend),
    )
    tokenizer = str(save_tiny_tokenizer(tmp_path / "tok"))
    prompts, sampling = {"prompt": ["a", "The quick brown fox"]}, SamplingConfig(max_new_tokens=16, temperature=0.9)

    def sample(backend):
        torch.manual_seed(0)
        options = HFModelOptions(config=tiny_llama_config(), tokenizer=tokenizer)
        policy = HFPolicy(
            model=options, generation=GenerationOptions(backend=backend), prompt=PromptOptions(template="raw")
        ).to("cuda")
        torch.manual_seed(3)
        return policy.generation, policy.sample(prompts, n=4, sampling=sampling)

    _, eager = sample(StaticCacheGeneration(compile="none"))
    with pytest.warns(UserWarning, match=r"\('compiled-forward'\) failed, so it runs as a CUDA graph of the eager"):
        backend, graphed = sample(StaticCacheGeneration())
    assert backend._compile_failed == "cuda-graph"
    workspaces = next(iter(backend._workspaces._by_model.values()))[1].values()
    assert "cuda-graph" in {mode for workspace in workspaces for _, mode in workspace.steps}
    assert torch.equal(graphed.response_ids, eager.response_ids)
    torch.testing.assert_close(graphed.sampling_log_probs, eager.sampling_log_probs, atol=1e-4, rtol=0)


def _static(model, pool, mode: str, seed: int = 0):
    torch.manual_seed(seed)
    sampling = SamplingConfig(max_new_tokens=24, temperature=0.9)
    return static_only(model, sampling, pool=pool, mode=mode, device="cuda")


def test_a_cuda_graph_captured_under_cached_autocast_reads_the_weights_after_an_update():
    """An fp32 model sampled as it is under Lightning's autocast (`dtype: auto` samples through an autocast copy, whose
    linear weights need no cast, where it can copy the model), whose cache holds a bf16 cast of each weight: the graph
    records its own casts (an uncached capture), so after an update in place it samples what the eager step
    samples from the new weights, not from the cached copies of the old ones."""
    from rlvr_lightning.generation.static_cache import WorkspacePool

    model, pool = tiny_model("llama").cuda(), WorkspacePool()
    with torch.autocast("cuda", dtype=torch.bfloat16):  # cache_enabled, as Lightning's
        _static(model, pool, "cuda-graph")  # captures
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.mul_(1.5)  # the cache still holds the old casts
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            graphed, eager = _static(model, pool, "cuda-graph", 1), _static(model, WorkspacePool(), "none", 1)
    assert torch.equal(graphed.response_ids, eager.response_ids)
    assert torch.equal(graphed.log_probs, eager.log_probs)


def test_a_graph_first_recorded_in_a_background_thread_samples_the_eager_loops_tokens():
    """Background rollouts (`rollout_staleness: 1`) decode in their own thread, where a new row bucket or a longer
    cache records a new graph (inductor's graph trees failed there before torch 2.12 without our set-up)."""
    from concurrent.futures import ThreadPoolExecutor

    model = tiny_model("llama").cuda()
    sampling = SamplingConfig(max_new_tokens=16, temperature=0.8)
    with ThreadPoolExecutor(max_workers=1) as worker:
        pair = worker.submit(run_pair, model, sampling, mode="reduce-overhead", device="cuda").result()
    assert_same(pair, log_prob_tolerance=1e-4)


def test_a_workspace_built_in_inference_mode_serves_the_next_training_rollout():
    """`trainer.validate` runs in `torch.inference_mode`; the workspace it builds is updated in place by training."""
    from rlvr_lightning.generation.static_cache import WorkspacePool

    model, pool = tiny_model("llama").cuda(), WorkspacePool()
    with torch.inference_mode():
        validation = _static(model, pool, "reduce-overhead")
    training = _static(model, pool, "reduce-overhead")
    assert torch.equal(validation.response_ids, training.response_ids)

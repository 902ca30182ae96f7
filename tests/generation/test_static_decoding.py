"""Static decoding (`StaticCacheGeneration`'s loop, its step run eagerly) samples what our eager loop samples for
the same random stream: tokens, masks, ends and step counts identical, log-probs within 1e-5 in fp32, and the
generator left where the eager loop leaves it (tests/generation/static_pairs.py)."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.generation.static_cache import WorkspacePool, row_bucket

from .static_pairs import assert_same, run_pair, static_only, tiny_model


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def test_sampled_rows_end_by_eos_stop_string_and_cap_as_in_the_eager_loop(llama):
    pool = WorkspacePool()
    sampling = SamplingConfig(max_new_tokens=24, temperature=0.8)
    pair = run_pair(llama, sampling, caps=[24, 3, 17], stop_strings=("dd",), pool=pool)
    assert_same(pair)
    ws = next(iter(pool._by_model.values()))[1][16]
    assert not ws.alive.any() and (ws.token[:12] == 0).all()  # every row ended on the device too, and is fed pad
    out, lengths = pair.static, pair.static.response_mask.sum(-1)
    ended_by_eos = ~out.truncated & ~out.stopped_by_string
    assert ended_by_eos.any() and out.stopped_by_string.any() and out.truncated.any()  # every kind of end happened
    assert (lengths[4:8] <= 3).all() and len(set(lengths.tolist())) > 4  # the second prompt's cap; uneven lengths


def test_greedy_decoding_with_eos(llama):
    assert_same(run_pair(llama, SamplingConfig(max_new_tokens=20, do_sample=False), sync_every=3))


def test_top_k_top_p_and_min_new_tokens(llama):
    sampling = SamplingConfig(max_new_tokens=16, top_k=8, top_p=0.9, min_new_tokens=6, temperature=1.3)
    pair = run_pair(llama, sampling, sync_every=4)
    assert_same(pair)
    assert (pair.static.response_mask.sum(-1) >= 6).all() and (~pair.static.truncated).any()


def test_min_p_with_top_k(llama):
    sampling = SamplingConfig(max_new_tokens=16, top_k=12, min_p=0.3, temperature=0.3)
    pair = run_pair(llama, sampling, sync_every=4)
    assert_same(pair)
    unfiltered = run_pair(llama, SamplingConfig(max_new_tokens=16, top_k=12, temperature=0.3), sync_every=4)
    assert not torch.equal(pair.eager.response_ids, unfiltered.eager.response_ids)  # min-p removed some draws


def test_min_new_tokens_without_filters(llama):
    """EOS excluded before step 6: the log-prob switches formula at that step, as the eager loop's does."""
    assert_same(run_pair(llama, SamplingConfig(max_new_tokens=16, min_new_tokens=6), sync_every=4))


@pytest.mark.parametrize("sync_every", [1, 2, 7, 64])
def test_every_read_interval_ends_rows_at_the_same_step(llama, sync_every):
    sampling = SamplingConfig(max_new_tokens=24, temperature=0.8)
    pair = run_pair(llama, sampling, stop_strings=("dd",), sync_every=sync_every)
    assert_same(pair)
    assert pair.static.stats["host_reads"] == -(-pair.static.steps // sync_every)


def test_qwen2_with_biased_projections():
    sampling = SamplingConfig(max_new_tokens=20)
    assert_same(run_pair(tiny_model("qwen2"), sampling, stop_strings=("dd",), caps=[20, 5, 12]))


def test_a_workspace_serves_prompts_of_other_lengths_and_batches_of_its_bucket(llama):
    pool = WorkspacePool()
    sampling = SamplingConfig(max_new_tokens=12)
    assert_same(run_pair(llama, sampling, pool=pool))  # 12 rows in a bucket of 16
    first = next(iter(pool._by_model.values()))[1][16]
    longer = [[5, 6, 7, 8, 9, 10, 11], [12], [13, 14], [15, 16, 17]]
    assert_same(run_pair(llama, sampling, prompts=longer, pool=pool, seed=2))  # 16 rows, longer prompts
    assert next(iter(pool._by_model.values()))[1][16] is first  # the same buffers (and graph) again
    assert row_bucket(12) == 16 and row_bucket(16) == 16 and row_bucket(17) == 32 and row_bucket(1) == 1


def test_a_single_new_token(llama):
    assert_same(run_pair(llama, SamplingConfig(max_new_tokens=1), n=2))


def test_rows_continue_after_a_stop_string_only_on_the_device(llama):
    """A row that meets the stop string mid-block keeps decoding until the block's read; its later tokens (even an
    EOS) are discarded and it ends at the stop string's step."""
    pair = run_pair(llama, SamplingConfig(max_new_tokens=24), stop_strings=("dd",), sync_every=24)
    assert_same(pair)
    assert pair.static.stopped_by_string.any() and pair.static.stats["host_reads"] == 1


def test_generation_draws_from_the_generator_it_is_given(llama):
    outs, global_state = [], torch.get_rng_state()
    for _ in range(2):
        generator = torch.Generator().manual_seed(3)
        sampling = SamplingConfig(max_new_tokens=8)
        outs.append(static_only(llama, sampling, prompts=[[5, 6], [7]], n=2, sync_every=3, generator=generator))
    assert torch.equal(outs[0].response_ids, outs[1].response_ids)
    assert torch.equal(global_state, torch.get_rng_state())


def test_steps_past_the_end_leave_no_trace_in_the_random_stream(llama):
    """Every row ends at step 39, mid-block: the 3 steps decoded after it drew uniforms the eager loop never drew,
    and the generator is put back to its state after step 39."""
    pair = run_pair(llama, SamplingConfig(max_new_tokens=64), stop_strings=("dd",), sync_every=7)
    assert_same(pair)
    assert pair.static.steps == 39 and pair.static.stats["host_reads"] == 6  # 42 steps decoded


def test_a_workspace_notices_weights_stored_elsewhere(llama):
    """A captured CUDA graph reads the weights at the addresses it was captured with: moved weights (a new
    tensor, not an in-place update) make `runnable_step` capture again."""
    pool = WorkspacePool()
    assert_same(run_pair(llama, SamplingConfig(max_new_tokens=4), pool=pool))
    ws = next(iter(pool._by_model.values()))[1][16]
    with torch.no_grad():
        llama.lm_head.weight.mul_(1.0)  # in place: the same storage
        assert not ws.weights_moved(llama)
        llama.lm_head.weight.data = llama.lm_head.weight.data.clone()
    assert ws.weights_moved(llama) and not ws.weights_moved(llama)


def test_a_graph_capture_runs_on_a_workspace_loaded_again_afterwards(llama, monkeypatch):
    """`cuda-graph` on a CPU with a stand-in capture that runs the step twice (the warm-up) and returns it: the
    warm-up steps leave no trace, and moved weights bring a new capture (and a new load)."""
    from rlvr_lightning.generation import step_capture

    captures = []

    def stand_in(step, warmup=2):
        captures.append(step)
        for _ in range(warmup):
            step()
        return step

    monkeypatch.setattr(step_capture, "captured_cuda_graph", stand_in)
    pool, sampling = WorkspacePool(), SamplingConfig(max_new_tokens=16, min_new_tokens=2)
    for seed in (1, 2):
        assert_same(run_pair(llama, sampling, stop_strings=("dd",), mode="cuda-graph", pool=pool, seed=seed))
    assert len(captures) == 1
    with torch.no_grad():
        llama.lm_head.weight.data = llama.lm_head.weight.data.clone()
    assert_same(run_pair(llama, sampling, stop_strings=("dd",), mode="cuda-graph", pool=pool, seed=3))
    assert len(captures) == 2


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_a_compiled_forward_in_a_captured_step_samples_the_eager_loops_tokens(model_type, monkeypatch):
    """`compiled-forward` on a CPU with the stand-in capture: the model's forward compiled by inductor (one graph per
    row bucket, its warm-up runs compiling it) inside the step as Python writes it samples the eager loop's tokens
    (the compiled kernels' rounding: log-probs within 1e-5), sampled and greedy."""
    from rlvr_lightning.generation import step_capture

    captures, compiled_models = [], []
    real_compiled_forward = step_capture.compiled_forward

    def stand_in(step, warmup=2, compiles=False):
        captures.append(compiles)
        for _ in range(warmup):
            step()
        return step

    def counted_compiled_forward(model):
        compiled_models.append(model)
        return real_compiled_forward(model)

    monkeypatch.setattr(step_capture, "captured_cuda_graph", stand_in)
    monkeypatch.setattr(step_capture, "compiled_forward", counted_compiled_forward)
    model, pool = tiny_model(model_type), WorkspacePool()
    sampling = SamplingConfig(max_new_tokens=12, min_new_tokens=2, temperature=0.8)
    for seed in (1, 2):
        assert_same(run_pair(model, sampling, stop_strings=("dd",), mode="compiled-forward", pool=pool, seed=seed))
    assert captures == [True] and compiled_models == [model]
    greedy = SamplingConfig(max_new_tokens=8, do_sample=False)
    assert_same(run_pair(model, greedy, stop_strings=("dd",), mode="compiled-forward", pool=pool))
    assert captures == [True, True] and compiled_models == [model, model]  # other options: a step of their own

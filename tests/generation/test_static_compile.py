"""The static decoding step compiles as one graph (`torch.compile(fullgraph=True)`, here with the `aot_eager`
backend, which runs the traced graph with torch's own operators) and samples what the eager loop samples; prompts
of another length replay the same graph."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.generation.static_cache import WorkspacePool

from .static_pairs import assert_same, run_pair, tiny_model


@pytest.fixture
def compile_counts():
    """Graphs dynamo compiled and graph breaks it met during the test."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield counters
    torch._dynamo.reset()


def test_the_compiled_step_is_one_graph_and_samples_as_the_eager_loop(compile_counts):
    model, pool = tiny_model("llama"), WorkspacePool()
    sampling = SamplingConfig(max_new_tokens=24, temperature=0.8, min_new_tokens=3)
    assert_same(run_pair(model, sampling, caps=[24, 3, 17], stop_strings=("dd",), mode="aot_eager", pool=pool))
    assert compile_counts["stats"]["unique_graphs"] == 1 and not compile_counts["graph_break"]
    longer = [[5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15]]
    assert_same(run_pair(model, sampling, prompts=longer, mode="aot_eager", pool=pool, seed=5))
    assert compile_counts["stats"]["unique_graphs"] == 1  # the same graph, not a recompilation


def test_greedy_decoding_compiles_its_own_graph(compile_counts):
    pair = run_pair(tiny_model("qwen2"), SamplingConfig(max_new_tokens=12, do_sample=False), mode="aot_eager")
    assert_same(pair)
    assert compile_counts["stats"]["unique_graphs"] == 1 and not compile_counts["graph_break"]

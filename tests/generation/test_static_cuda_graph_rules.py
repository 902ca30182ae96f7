"""Inductor's CUDA graphs (`reduce-overhead`, static decoding's default on a CUDA device) would hold the compiled
decoding step, by inductor's own rules, checked on a CPU.

Where a rule fails, inductor does not raise: it warns "skipping cudagraphs due to ..." and runs the step's kernels
launched from Python, tens of times slower on a GPU, with the same tokens. Its rules: every input the graph writes
is a static address (a parameter, a buffer, or a tensor marked with `torch._dynamo.mark_static_address`), no
operator a graph cannot hold, every input a tensor, and no tensor on the CPU (checked with the model and workspace on
the meta device, where a tensor made without naming a device is the only one on the CPU).
`tests/gpu/test_static_decoding_cuda.py` makes a skip an error on a GPU."""

from __future__ import annotations

import inspect
import os
import traceback
from pathlib import Path

import pytest
import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import rlvr_lightning
from rlvr_lightning.generation.sampling_config import SamplingConfig

from .static_pairs import assert_same, run_pair, tiny_model


@pytest.fixture
def compiled_graphs(monkeypatch, compile_counts):
    """The graphs inductor builds during the test, each as (its FX graph, the indices of the inputs it writes, of
    its static inputs, its example inputs): what inductor's CUDA graphs decide on (`output_code.CompiledFxGraph`).
    Inductor's caches are off, so that every graph is built here."""
    from torch._inductor import output_code

    built = []
    init = output_code.CompiledFxGraph.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        bound = inspect.signature(init).bind(self, *args, **kwargs).arguments
        static = set(bound["static_input_idxs"])
        built.append((bound["gm"], set(self.mutated_input_idxs), static, bound["example_inputs"]))

    monkeypatch.setattr(output_code.CompiledFxGraph, "__init__", recording_init)
    with torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        yield built


def cuda_graph_refusals(gm, mutated: set[int], static: set[int], example_inputs) -> list[str]:
    """Why inductor's CUDA graphs would skip this graph on a CUDA device (the device rule aside), in its words."""
    from torch._inductor.cudagraph_utils import get_mutation_stack_trace, get_placeholder_info
    from torch._inductor.utils import get_first_incompatible_cudagraph_node

    reasons = []
    written = sorted(mutated - static)
    if written:
        names = [node.name for node in gm.graph.nodes if node.op == "placeholder"]
        stack = get_mutation_stack_trace(get_placeholder_info(gm.graph), written)
        reasons.append(f"{stack} (inputs {[names[i] for i in written]})")
    incompatible = get_first_incompatible_cudagraph_node(gm)
    if incompatible is not None:
        reasons.append(f"incompatible op {incompatible.target}")
    if not all(isinstance(t, (torch.Tensor, torch.SymInt, torch.Generator)) for t in example_inputs):
        reasons.append("non-Tensor inputs")
    return reasons


@pytest.mark.parametrize(
    "model_type, sampling",
    [
        ("llama", SamplingConfig(max_new_tokens=6, temperature=0.8, min_new_tokens=2, top_k=20, top_p=0.9)),
        ("qwen2", SamplingConfig(max_new_tokens=6, do_sample=False)),
    ],
    ids=["sampled-filtered", "greedy"],
)
def test_inductor_would_hold_the_compiled_step_in_a_cuda_graph(compiled_graphs, model_type, sampling):
    pair = run_pair(tiny_model(model_type), sampling, caps=[6, 2, 5], mode="default")
    assert_same(pair)
    assert len(compiled_graphs) == 1  # the step, one graph
    gm, mutated, static, example_inputs = compiled_graphs[0]
    assert mutated, "the step writes its workspace in place"
    assert cuda_graph_refusals(gm, mutated, static, example_inputs) == []


def test_an_unmarked_workspace_buffer_is_refused(compiled_graphs, monkeypatch):
    """The check sees what inductor sees: the workspace's buffers left unmarked are written non-static inputs."""
    from rlvr_lightning.generation.static_cache import DecodeWorkspace

    monkeypatch.setattr(DecodeWorkspace, "_mark_static", lambda self: None)
    run_pair(tiny_model("llama"), SamplingConfig(max_new_tokens=4), mode="default")
    refusals = cuda_graph_refusals(*compiled_graphs[0])
    assert len(refusals) == 1 and "skipping cudagraphs due to mutated inputs" in refusals[0], refusals


SOURCES = tuple(str(Path(package.__file__).parent) + os.sep for package in (rlvr_lightning, transformers))


class CPUTensors(TorchDispatchMode):
    """Each operator that returns a tensor on the CPU, with the lines of ours and transformers' that called it."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in tree_leaves(out)):
            frames = [f for f in traceback.extract_stack() if f.filename.startswith(SOURCES)]
            self.made.append(f"{func} at {frames[-1].filename}:{frames[-1].lineno}" if frames else str(func))
        return out


def cpu_tensors_of_a_step(model, options) -> list[str]:
    """The CPU tensors one decoding step makes with `model` and its workspace on the meta device (shapes only)."""
    from rlvr_lightning.generation.decode_attention import decoding_attention
    from rlvr_lightning.generation.static_cache import DecodeWorkspace
    from rlvr_lightning.generation.static_decode import decode_step

    model = model.to("meta")
    heads, dim = model.config.num_key_value_heads, model.config.hidden_size // model.config.num_attention_heads
    like = torch.empty(1, heads, 1, dim, device="meta")
    ws = DecodeWorkspace(model, 16, 64, like, like)
    ws.start(16, [8] * 16, torch.tensor([2, 3], device="meta"), min_new_tokens=2)
    made = CPUTensors()
    with torch.no_grad(), decoding_attention(model), made:
        decode_step(ws, model, options)
    return made.made


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
@pytest.mark.parametrize(
    "options",
    [dict(temperature=0.8, top_k=10, top_p=0.9, min_p=0.05, suppress_eos=True), dict(do_sample=False)],
    ids=["sampled-filtered", "greedy"],
)
def test_the_step_makes_no_cpu_tensor_where_its_model_is_elsewhere(model_type, options):
    from rlvr_lightning.generation.static_decode import StepOptions

    assert cpu_tensors_of_a_step(tiny_model(model_type), StepOptions(**options)) == []


def test_a_constant_made_on_the_cpu_is_found(monkeypatch):
    from rlvr_lightning.generation import static_decode

    filter_logits = static_decode.filter_logits
    monkeypatch.setattr(static_decode, "filter_logits", lambda x, **kw: filter_logits(x, **kw) * torch.tensor(1.0))
    made = cpu_tensors_of_a_step(tiny_model("llama"), static_decode.StepOptions(top_k=10))
    assert len(made) == 1 and "static_decode.py" in made[0], made

"""`VLLMGeneration` against a recording stand-in for the vLLM engine (vLLM itself runs in tests/engines, in its
own environment): how weights are pushed (one tensor at a time, in the engine's dtype), the order of waking
up from sleep, and the dtype `dtype: auto` picks under bf16 training settings."""

from __future__ import annotations

import inspect
import sys
import types

import pytest
import torch

from rlvr_lightning.generation.compute_dtype import compute_dtype
from rlvr_lightning.policies import SamplingConfig, VLLMGeneration
from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions

SAMPLING = SamplingConfig(max_new_tokens=2)


class FakeLLM:
    """Records what the engine is asked to do; generates two fixed tokens per completion."""

    instances: list[FakeLLM] = []

    def __init__(self, model, **kwargs):
        self.kwargs = kwargs
        self.calls: list = []
        self.pushed: list[tuple[str, torch.dtype, bool, bool]] = []  # name, dtype, lazily made, under autocast
        FakeLLM.instances.append(self)

    def collective_rpc(self, method, kwargs):
        weights = kwargs["weights_iterator"]
        self.calls.append(method)
        for name, tensor in weights:
            # produced on demand, one at a time (a list's iterator would hold every full tensor at once)
            lazy = inspect.isgenerator(weights) and inspect.getgeneratorstate(weights) == inspect.GEN_SUSPENDED
            self.pushed.append((name, tensor.dtype, lazy, torch.is_autocast_enabled("cpu")))

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")

    def sleep(self, level):
        self.calls.append(f"sleep({level})")

    def wake_up(self, tags=None):
        self.calls.append(f"wake_up({','.join(tags)})" if tags else "wake_up()")

    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append("generate")
        self.autocast_in_generate = torch.is_autocast_enabled("cpu")
        logprob = types.SimpleNamespace(logprob=-0.5)
        completion = lambda index: types.SimpleNamespace(  # noqa: E731
            index=index,
            token_ids=[5, 6],
            logprobs=[{5: logprob}, {6: logprob}],
            finish_reason="length",
            stop_reason=None,
        )
        return [types.SimpleNamespace(outputs=[completion(i) for i in range(p.n)]) for p in params]


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM = FakeLLM
    module.SamplingParams = lambda **kwargs: types.SimpleNamespace(**kwargs)
    monkeypatch.setitem(sys.modules, "vllm", module)
    FakeLLM.instances.clear()
    return FakeLLM.instances


def fake_gpu(monkeypatch):
    """Sleep mode acts on a GPU only: `torch.cuda.is_available` says yes, its RNG calls do nothing."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: None)


def step(policy):
    """An optimizer step's worth of change (the engine pushes again only when weights changed)."""
    with torch.no_grad():
        for param in policy.parameters():
            param.add_(0.01)


def test_bf16_mixed_pushes_bf16_tensors_one_at_a_time_and_its_log_probs_are_not_exact(make_policy, fake_vllm):
    policy = make_policy(generation=GenerationOptions(backend=VLLMGeneration(dtype="auto")))
    assert {p.dtype for p in policy.parameters()} == {torch.float32}  # fp32 master weights
    with torch.autocast("cpu", dtype=torch.bfloat16):  # what Lightning's bf16-mixed enters around each step
        rollout = policy.sample({"prompt": ["a b", "c"]}, 2, SAMPLING)
    engine = fake_vllm[0]
    assert engine.kwargs["dtype"] == "bfloat16"  # the compute dtype, not the master weights' float32
    assert engine.pushed and {dtype for _, dtype, _, _ in engine.pushed} == {torch.bfloat16}
    assert all(lazy and not autocast for _, _, lazy, autocast in engine.pushed)
    assert len(engine.pushed) == len(policy.model.state_dict())
    assert not engine.autocast_in_generate  # the engine computes in its own dtype
    assert rollout.response_ids.shape == (4, 2) and not policy.sampling_log_probs_exact


def test_an_fp32_run_pushes_fp32_and_its_unfiltered_log_probs_are_exact(make_policy, fake_vllm):
    policy = make_policy(generation=GenerationOptions(backend=VLLMGeneration(dtype="auto")))
    policy.sample({"prompt": ["a b"]}, 2, SAMPLING)
    assert fake_vllm[0].kwargs["dtype"] == "float32" and {dtype for _, dtype, _, _ in fake_vllm[0].pushed} == {
        torch.float32
    }
    assert all(lazy for _, _, lazy, _ in fake_vllm[0].pushed)
    assert policy.sampling_log_probs_exact


def test_bf16_weights_give_a_bf16_engine(make_policy, fake_vllm):
    policy = make_policy(
        model=HFModelOptions(dtype="bfloat16"), generation=GenerationOptions(backend=VLLMGeneration(dtype="auto"))
    )  # as bf16-true converts them
    policy.sample({"prompt": ["a b"]}, 1, SAMPLING)
    assert fake_vllm[0].kwargs["dtype"] == "bfloat16" and not policy.sampling_log_probs_exact


@pytest.mark.parametrize("level", [1, 2])
def test_waking_up_takes_the_weights_then_the_push_then_the_kv_cache(make_policy, fake_vllm, monkeypatch, level):
    fake_gpu(monkeypatch)
    policy = make_policy(generation=GenerationOptions(backend=VLLMGeneration(dtype="float32", sleep_level=level)))
    policy.sample({"prompt": ["a b"]}, 1, SAMPLING)
    engine = fake_vllm[0]
    assert engine.calls == ["reload_weights", "reset_prefix_cache", "generate", f"sleep({level})"]
    engine.calls.clear()
    step(policy)
    policy.sample({"prompt": ["a b"]}, 1, SAMPLING)
    assert engine.calls == [
        "wake_up(weights)",
        "reload_weights",
        "reset_prefix_cache",
        "wake_up(kv_cache)",
        "generate",
        f"sleep({level})",
    ]
    engine.calls.clear()
    policy.sample({"prompt": ["a b"]}, 1, SAMPLING)  # unchanged weights: pushed again only if level 2 discarded them
    push = ["reload_weights", "reset_prefix_cache"] if level == 2 else []
    assert engine.calls == ["wake_up(weights)", *push, "wake_up(kv_cache)", "generate", f"sleep({level})"]
    engine.calls.clear()
    step(policy)
    policy.generation.push_weights(policy.model, policy.tokenizer)  # between updates (rollout_staleness=1)
    assert engine.calls == ["wake_up(weights)", "reload_weights", "reset_prefix_cache"]  # the KV cache stays asleep


def test_fsdp2_param_dtype_is_the_compute_dtype():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        assert compute_dtype(model) == torch.float32
        fully_shard(
            model, mesh=init_device_mesh("cpu", (1,)), mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16)
        )
        assert next(model.parameters()).dtype == torch.float32  # the sharded master weights
        assert compute_dtype(model) == torch.bfloat16
    finally:
        dist.destroy_process_group()

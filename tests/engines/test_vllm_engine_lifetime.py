"""Engines one after another in one process. vLLM's in-process engine tears down the process's distributed state
when it is finalised, and its model loader runs the garbage collector: an engine that died in a reference cycle
(as a trainer holds its module) must be finalised before the next engine starts, not while that one loads its
model (where it would take the new engine's state with it: "pipeline model parallel group is not initialized")."""

from __future__ import annotations

from rlvr_lightning.policies import SamplingConfig, VLLMGeneration
from rlvr_lightning.policies.hf_options import GenerationOptions

GREEDY = SamplingConfig(do_sample=False, max_new_tokens=4)
BATCH = {"prompt": ["What is 2+3?"]}


def _import_vllm() -> None:
    """vLLM keeps the traceback of an optional import that fails (torchcodec) in a module global, and with it
    every frame above that import: a policy whose engine made that first import would stay alive for good."""
    from vllm import LLM, SamplingParams  # noqa: F401


def test_a_dead_engine_is_finalised_before_the_next_one_starts(make_policy, monkeypatch):
    import vllm

    _import_vllm()
    first = make_policy(
        generation=GenerationOptions(backend=VLLMGeneration(dtype="float32", kv_cache_memory_gib=0.0625))
    )
    first.sample(BATCH, 1, GREEDY)
    finalizer = first.generation._llm.llm_engine.engine_core._finalizer  # runs the engine's shutdown
    first.holder = [first]  # a cycle through objects vLLM froze at engine start: only the collector frees it
    del first

    pending_at_start = []
    engine_class = vllm.LLM

    def recording(*args, **kwargs):
        pending_at_start.append(finalizer.alive)
        return engine_class(*args, **kwargs)

    monkeypatch.setattr(vllm, "LLM", recording)
    second = make_policy(
        generation=GenerationOptions(backend=VLLMGeneration(dtype="float32", kv_cache_memory_gib=0.0625))
    )
    expected = second.sample(BATCH, 1, GREEDY).response_ids  # starts the second engine
    assert pending_at_start == [False]
    assert (second.sample(BATCH, 1, GREEDY).response_ids == expected).all()

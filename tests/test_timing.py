"""Timers around device work read the clock after the device's queued work has run (CUDA kernels are
asynchronous: a clock read right after queuing them measures the queuing). CUDA is a stand-in here."""

from __future__ import annotations

import types

import torch

from rlvr_lightning.demos.tiny_lm import tiny_llama_config
from rlvr_lightning.generation import loop as generation
from rlvr_lightning.modules import rlvr as rlvr_module
from rlvr_lightning.runtime import timing
from rlvr_lightning.runtime.timing import clock, elapsed_seconds


def test_clock_waits_for_this_thread_s_stream_before_reading_the_time(monkeypatch):
    events = []

    class Stream:
        def __init__(self, device):
            self.device = device

        def synchronize(self):
            events.append(("synchronize", self.device))

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream(device))
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: events.append("clock") or 5.0))
    assert clock(torch.device("cuda", 1)) == 5.0
    assert events == [("synchronize", torch.device("cuda", 1)), "clock"]  # the rank's device, before the clock
    events.clear()
    assert elapsed_seconds(2.0, "cuda:0") == 3.0 and events == [("synchronize", torch.device("cuda", 0)), "clock"]
    events.clear()
    clock(torch.device("cpu"))
    clock(None)
    assert events == ["clock", "clock"]  # nothing is queued on a CPU


def test_the_decoding_loop_times_prefill_and_generation_on_the_device_clock(monkeypatch):
    from transformers import AutoConfig, AutoModelForCausalLM

    calls = []
    monkeypatch.setattr(
        generation, "elapsed_seconds", lambda started, device: calls.append(device) or 0.25 * len(calls)
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**tiny_llama_config(vocab_size=64))).eval()
    ids, mask = generation.left_pad([[5, 6], [7]], pad_id=0)
    out = generation.generate(model, ids, mask, 2, max_new_tokens=3, eos_token_ids=[1], pad_token_id=0)
    assert calls == [ids.device, ids.device]
    assert (out.prefill_seconds, out.seconds) == (0.25, 0.5)


def test_training_step_times_read_the_device_clock(monkeypatch, in_tmp_dir):
    from rlvr_lightning.rewards import SortInclusionOrderingReward
    from tests.modules.test_rlvr_module import fit, policy

    devices = []
    monkeypatch.setattr(rlvr_module, "clock", lambda device: devices.append(device) or 0.0)
    module = rlvr_module.RLVRModule(policy(), group_size=4)
    fit(module, [SortInclusionOrderingReward()], steps=2)
    assert len(devices) == 2 * 4 and set(devices) == {module.device}  # started, generated, scored, finished

"""The thread that samples asynchronous rollouts (`RLVRModule(rollout_staleness=1)`): it reports no progress,
and samples with the trainer's torch thread count, under the first rollout's precision, on the rank's device and
a side stream of its own (an engine: none)."""

from __future__ import annotations

import contextlib
import threading
import types

import pytest
import torch

from rlvr_lightning.modules import RLVRModule, async_rollouts
from rlvr_lightning.modules.async_rollouts import AsyncRollouts
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.rewards import SortInclusionOrderingReward

from .async_recorders import RecordingPolicy, WeightsAtStepStart, openmp_threads, recording_policy
from .test_rlvr_module import fit


def test_a_muted_thread_reports_no_progress():
    from rlvr_lightning.runtime import stage_reports

    class Listener:
        def __init__(self):
            self.events = []

        def on_stage(self, stage):
            self.events.append((threading.current_thread().name, stage))

        def on_tokens(self, done, total):
            self.events.append((threading.current_thread().name, done))

    def background():
        with stage_reports.muted():
            stage_reports.report_tokens(1, 2)
            stage_reports.report_stage("generate")

    with stage_reports.listening(Listener()) as listener:
        thread = threading.Thread(target=background, name="rollout")
        thread.start()
        thread.join()
        stage_reports.report_stage("update")  # the main thread is not muted
    assert listener.events == [("MainThread", "update")]


def test_the_background_thread_samples_with_the_trainer_s_torch_thread_count(in_tmp_dir):
    # a new thread starts with OpenMP's default (OMP_NUM_THREADS, or one per core), not torch's setting, until a
    # parallel torch operation sets it: native kernels that read it first saw another count (vLLM's CPU
    # attention failed in CI: "thread_num 2 vs. 1")
    if openmp_threads() is None:
        pytest.skip("torch here does not use libgomp")
    threads = torch.get_num_threads()
    torch.set_num_threads(3)  # neither default
    try:
        module = RLVRModule(recording_policy(), group_size=4, rollout_staleness=1)
        weights = WeightsAtStepStart()
        fit(module, [SortInclusionOrderingReward(), weights], steps=3)
    finally:
        torch.set_num_threads(threads)
    background = [record for record in weights.trained[1:] if record["background"]]
    assert background and all(record["threads"] == 3 for record in background)


class AutocastRecordingPolicy(RecordingPolicy):
    def sample(self, batch, n, sampling, generator=None):
        rollout = super().sample(batch, n, sampling, generator)
        autocast = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))
        rollout.metadata = [{**m, "autocast": autocast} for m in rollout.metadata]
        return rollout


def test_background_rollouts_sample_under_the_precision_of_the_first(in_tmp_dir):
    # autocast is per thread: Lightning enters bf16-mixed's around training_step, in the training thread only
    torch.manual_seed(0)
    module = RLVRModule(
        AutocastRecordingPolicy(vocab_size=5, prompt_length=3, embedding_dim=4), group_size=4, rollout_staleness=1
    )
    weights = WeightsAtStepStart()
    fit(module, [SortInclusionOrderingReward(), weights], steps=4, precision="bf16-mixed")
    records = weights.trained[1:]
    assert [record["background"] for record in records] == [False, True, True]
    assert all(record["autocast"] == (True, torch.bfloat16) for record in records)


class FakeCuda:
    """torch.cuda stand-ins that record, per thread, the device set, the streams made and the current stream."""

    class Stream:
        def __init__(self, events, name, device=None):
            self.events, self.name, self.device = events, name, device

        def wait_stream(self, other):
            self.events.append(("wait_stream", self.name, other.name))

        def synchronize(self):
            self.events.append(("synchronize", self.name, threading.current_thread() is threading.main_thread()))

    def __init__(self, monkeypatch):
        self.events = []
        self.local = threading.local()
        self.default = self.Stream(self.events, "default")
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(
            torch.cuda,
            "set_device",
            lambda device: self.events.append(("set_device", torch.device(device), self.where())),
        )
        monkeypatch.setattr(torch.cuda, "Stream", self.new_stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: self.current())
        monkeypatch.setattr(torch.cuda, "stream", self.stream)

    def where(self) -> str:
        return "main" if threading.current_thread() is threading.main_thread() else "background"

    def new_stream(self, device=None):
        self.events.append(("Stream", device, self.where()))
        return self.Stream(self.events, "side", device)

    def current(self):
        return getattr(self.local, "stream", self.default)

    @contextlib.contextmanager
    def stream(self, stream):
        previous, self.local.stream = self.current(), stream
        try:
            yield
        finally:
            self.local.stream = previous


class EventPolicy(ToySortPolicy):
    cuda: FakeCuda | None = None

    def sample(self, batch, n, sampling, generator=None):
        self.cuda.events.append(("sample", self.cuda.where(), self.cuda.current().name))
        return super().sample(batch, n, sampling, generator)


def rollouts_on_fake_gpu(monkeypatch, policy):
    cuda = FakeCuda(monkeypatch)
    monkeypatch.setattr(EventPolicy, "cuda", cuda)
    monkeypatch.setattr(AsyncRollouts, "_device", lambda self: torch.device("cuda", 1))  # the rank's device
    monkeypatch.setattr(
        AsyncRollouts, "_generator_device", lambda self: torch.device("cpu")
    )  # the policy is on the CPU
    recorded = []
    monkeypatch.setattr(async_rollouts, "_record_stream", lambda rollout, stream: recorded.append(stream.name))
    return cuda, recorded, AsyncRollouts(policy, group_size=2, sampling=RLVRModule(policy).sampling)


def test_the_background_thread_samples_on_the_rank_s_device_and_a_side_stream(monkeypatch):
    torch.manual_seed(0)
    cuda, recorded, rollouts = rollouts_on_fake_gpu(
        monkeypatch, EventPolicy(vocab_size=5, prompt_length=3, embedding_dim=4)
    )
    batch = {"prompt": [[1, 2, 3]]}
    rollouts.sample_now(batch, version=0)  # the first rollout: nothing runs beside it
    assert ("sample", "main", "default") in cuda.events and not any(
        event[0] in ("Stream", "set_device") for event in cuda.events
    )
    cuda.events.clear()
    rollouts.launch(batch, version=1)
    rollouts.wait()
    background = [event for event in cuda.events if "background" in event or event[:2] == ("synchronize", "side")]
    assert background == [
        ("set_device", torch.device("cuda", 1), "background"),  # before any CUDA work of the thread
        ("sample", "background", "side"),
        ("synchronize", "side", False),  # the thread's clock waits for its own stream, not the update's
    ]
    assert ("Stream", torch.device("cuda", 1), "main") in cuda.events  # on the rank's device, once
    assert cuda.events.index(("wait_stream", "side", "default")) < cuda.events.index(("sample", "background", "side"))
    assert cuda.events[-1] == ("wait_stream", "default", "side") and recorded == ["default"]
    rollouts.queue.clear()  # taken by the training step (its move to the device is CUDA work)
    cuda.events.clear()
    rollouts.launch(batch, version=2)
    rollouts.close()
    assert sum(event[0] == "Stream" for event in cuda.events) == 0  # one side stream per run
    assert ("set_device", torch.device("cuda", 1), "background") in cuda.events


def test_an_engine_samples_without_a_side_stream(monkeypatch):
    class EnginePolicy(EventPolicy):
        tokenizer = None

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.generation = types.SimpleNamespace(
                owns_weights=True, push_on_generate=True, push_weights=lambda model, tokenizer: 0.0
            )

        @property
        def model(self):
            return self

        def sampling_copy(self):
            return self

    torch.manual_seed(0)
    cuda, recorded, rollouts = rollouts_on_fake_gpu(
        monkeypatch, EnginePolicy(vocab_size=5, prompt_length=3, embedding_dim=4)
    )
    rollouts.sample_now({"prompt": [[1, 2, 3]]}, version=0)
    rollouts.launch({"prompt": [[1, 2, 3]]}, version=1)
    rollouts.wait()
    assert not any(event[0] in ("Stream", "wait_stream") for event in cuda.events) and not recorded
    assert ("sample", "background", "default") in cuda.events
    assert ("set_device", torch.device("cuda", 1), "background") in cuda.events

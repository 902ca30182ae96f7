"""Asynchronous rollouts (`RLVRModule(rollout_staleness=1)`): which weights sampled the trained rollout, the
overlap of generation and update, the decoupled loss by hand, and the options."""

from __future__ import annotations

import contextlib
import ctypes
import math
import threading
import time
import types
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from rlvr_lightning.core.aggregation import aggregate_loss
from rlvr_lightning.modules import RLVRModule, async_rollouts
from rlvr_lightning.modules.async_rollouts import AsyncRollouts
from rlvr_lightning.modules.options import AggregationConfig, ImportanceSamplingConfig, UpdateConfig
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.rewards import SortInclusionOrderingReward

from .test_rlvr_module import fit


def fingerprint(policy: torch.nn.Module) -> float:
    """A number that changes whenever an optimizer step changes the weights."""
    return float(sum(p.detach().double().sum() for p in policy.parameters()))


def openmp_threads() -> int | None:
    """This thread's OpenMP thread count as native kernels see it (torch's own query reads a global)."""
    maps = Path("/proc/self/maps")
    paths = (
        {line.split()[-1] for line in maps.read_text().splitlines() if "libgomp" in line} if maps.exists() else set()
    )
    return ctypes.CDLL(sorted(paths)[0]).omp_get_max_threads() if paths else None


class RecordingPolicy(ToySortPolicy):
    """Writes into every row which weights sampled it, and in which thread; while sampling beside an update
    (not in the main thread), it waits for that update's first optimizer step to happen (`overlap`)."""

    overlap: dict | None = None  # {"steps": [int], "launched_at": int}: set by the overlap test

    def sample(self, batch, n, sampling, generator=None):
        threads = openmp_threads()  # before any torch operation of this thread could set it lazily
        before = fingerprint(self)
        background = threading.current_thread() is not threading.main_thread()
        overlapped = None
        if background and self.overlap is not None:
            deadline = time.monotonic() + 20
            while self.overlap["steps"][0] <= self.overlap["launched_at"] and time.monotonic() < deadline:
                time.sleep(0.001)
            overlapped = self.overlap["steps"][0] > self.overlap["launched_at"]
        rollout = super().sample(batch, n, sampling, generator)
        record = {
            "sampled_with": before,
            "unchanged": fingerprint(self) == before,
            "background": background,
            "own_generator": generator is not None,
            "overlapped": overlapped,
            "threads": threads,
        }
        rollout.metadata = [{**m, **record} for m in rollout.metadata]
        return rollout


class WeightsAtStepStart(pl.Callback):
    """The live weights' fingerprint at the start of every step, and the trained rollout's records."""

    def __init__(self):
        self.at_start, self.trained = [], []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.at_start.append(fingerprint(pl_module.policy))
        pl_module.last_rollout = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        rollout = pl_module.last_rollout
        self.trained.append(None if rollout is None else rollout.metadata[0])


def recording_policy():
    torch.manual_seed(0)
    return RecordingPolicy(vocab_size=5, prompt_length=3, embedding_dim=4)


@pytest.mark.parametrize("staleness", [0, 1])
def test_the_trained_rollout_was_sampled_by_the_weights_one_update_back(in_tmp_dir, staleness):
    module = RLVRModule(recording_policy(), group_size=4, rollout_staleness=staleness, update=UpdateConfig(epochs=2))
    weights = WeightsAtStepStart()
    trainer, recorder = fit(module, [SortInclusionOrderingReward(), weights], steps=5)
    at_start = weights.at_start
    if staleness == 0:
        assert len(set(at_start)) >= 4  # the updates moved the weights (the first one had no informative group)
        assert all(record["sampled_with"] == at_start[t] for t, record in enumerate(weights.trained))
        assert not any(record["background"] or record["own_generator"] for record in weights.trained)
        assert trainer.global_step == 5 * 2
        return
    # step 0 samples the rollout of batch 0 and makes no update; step t trains on batch t-1's rollout,
    # sampled with the weights step t-1 started from: W_{t-1}, the weights before step t-1's update
    assert weights.trained[0] is None and trainer.global_step == 4 * 2
    assert at_start[1] == at_start[0] and len(set(at_start[1:])) == 4
    for t in range(1, 5):
        record = weights.trained[t]
        assert record["sampled_with"] == at_start[t - 1]
        assert t == 1 or record["sampled_with"] != at_start[t]  # stale: the live weights moved on
        assert record["own_generator"] and record["unchanged"]
    assert [record["background"] for record in weights.trained[1:]] == [
        False,
        True,
        True,
        True,
    ]  # step 0 sampled in the main thread
    lags = [step.get("train/async/policy_lag") for step in recorder.steps]
    assert lags == [None, 0.0, 2.0, 2.0, 2.0]  # optimizer steps between sampling and training weights


def test_generation_runs_beside_the_update_on_weights_that_do_not_change(in_tmp_dir, monkeypatch):
    steps = [0]
    overlap = {"steps": steps, "launched_at": -1}
    launch = AsyncRollouts.launch

    def recording_launch(self, batch, version):
        overlap["launched_at"] = steps[0]
        return launch(self, batch, version)

    monkeypatch.setattr(AsyncRollouts, "launch", recording_launch)
    monkeypatch.setattr(RecordingPolicy, "overlap", overlap)
    hook = register_optimizer_step_post_hook(lambda optimizer, args, kwargs: steps.__setitem__(0, steps[0] + 1))
    try:
        module = RLVRModule(recording_policy(), group_size=4, rollout_staleness=1, update=UpdateConfig(epochs=2))
        weights = WeightsAtStepStart()
        fit(module, [SortInclusionOrderingReward(), weights], steps=4)
    finally:
        hook.remove()
    background = [record for record in weights.trained if record is not None and record["background"]]
    assert len(background) == 2  # the rollouts of batches 1 and 2, sampled during the updates of steps 1 and 2
    assert all(record["overlapped"] for record in background)  # an optimizer step happened while each sampled
    assert all(record["unchanged"] for record in background)  # ... and the sampler's weights did not move


def test_decoupled_loss_by_hand():
    """loss_t = -w_t * min(r_t A, clip(r_t) A), r = pi_theta / pi_prox, w = pi_prox / pi_behav, 0 above the cap
    (AReaL's decoupled PPO; rollout_staleness=1 defaults to rollout_is.mode='token_mask', cap rollout_is.max=2)."""
    torch.manual_seed(0)
    module = RLVRModule(
        ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4),
        rollout_staleness=1,
        aggregation=AggregationConfig(mode="token-mean"),
    )
    assert module.rollout_is.mode == "token_mask"
    rollout = module.policy.sample({"prompt": [[1, 2, 3]]}, n=2, sampling=module.sampling)
    log_probs, _ = module.policy.token_log_probs(rollout)
    log_probs = log_probs.detach()
    # row 0 (A = +1): r = 1.1 (inside the clip range 0.8..1.2), w = 1.5, 1.5, 3 (above the cap: masked)
    # row 1 (A = -1): r = 1.3 (clipped above, but A < 0 takes the unclipped -1.3), w = 0.5 for every token
    ratio = torch.tensor([[1.1] * 3, [1.3] * 3])
    weight = torch.tensor([[1.5, 1.5, 3.0], [0.5, 0.5, 0.5]])
    rollout.old_log_probs = log_probs - ratio.log()
    rollout.sampling_log_probs = rollout.old_log_probs - weight.log()
    rollout.advantages = torch.tensor([1.0, -1.0])
    loss = module.policy_update.micro_batch_loss(rollout, None, num_sequences=2, num_tokens=6, first_epoch=True).loss
    # token losses: row 0: -1.5 * 1.1, -1.5 * 1.1, 0; row 1: -0.5 * min(-1.3, -1.2) = 0.65 each; token-mean over 6
    expected = (2 * (-1.5 * 1.1) + 0.0 + 3 * 0.65) / 6
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_one_update_per_step_uses_its_own_log_probs_as_the_proximal_policy():
    """With one update per step the trainer's current log-probs are pi_prox: r = 1 and w = pi_theta / pi_behav."""
    torch.manual_seed(0)
    module = RLVRModule(
        ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4), rollout_staleness=1, loss="ppo_clip"
    )
    rollout = module.policy.sample({"prompt": [[1, 2, 3], [0, 4, 2]]}, n=2, sampling=module.sampling)
    rollout.sampling_log_probs, rollout.old_log_probs = rollout.old_log_probs - math.log(1.25), None
    rollout.advantages = torch.tensor([1.0, -1.0, 0.5, 2.0])
    module.policy_update.add_old_and_reference_log_probs(rollout)
    assert rollout.old_log_probs is None  # one update: no forward pass for the old log-probs
    loss = module.policy_update.micro_batch_loss(rollout, None, num_sequences=4, num_tokens=12, first_epoch=True).loss
    log_probs, _ = module.policy.token_log_probs(rollout)
    expected = aggregate_loss(
        -1.25 * rollout.advantages[:, None] * torch.ones_like(log_probs),
        None,
        module.aggregation.mode,
        num_sequences=4,
        num_tokens=12,
    )
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_several_updates_recompute_the_old_log_probs_at_the_current_weights():
    torch.manual_seed(0)
    module = RLVRModule(
        ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4),
        rollout_staleness=1,
        update=UpdateConfig(epochs=2),
    )
    rollout = module.policy.sample({"prompt": [[1, 2, 3]]}, n=2, sampling=module.sampling)
    rollout.sampling_log_probs, rollout.old_log_probs = rollout.old_log_probs - 0.3, None
    module.policy_update.add_old_and_reference_log_probs(rollout)
    current, _ = module.policy.token_log_probs(rollout)
    torch.testing.assert_close(rollout.old_log_probs, current.detach())  # pi_prox, not the behaviour log-probs


def test_rollout_staleness_options():
    policy = ToySortPolicy(vocab_size=5, prompt_length=3)
    with pytest.raises(ValueError, match=r"rollout_staleness=2 is not valid; choose 0 \(on-policy\) or 1"):
        RLVRModule(policy, rollout_staleness=2)
    assert (
        RLVRModule(
            policy, rollout_staleness=1, rollout_is=ImportanceSamplingConfig(mode="token_truncate")
        ).rollout_is.mode
        == "token_truncate"
    )
    assert RLVRModule(policy).rollout_is.mode is None and RLVRModule(policy).async_rollouts is None

    class OldPolicy(ToySortPolicy):
        def sample(self, batch, n, sampling):
            return super().sample(batch, n, sampling)

    with pytest.raises(TypeError, match=r"OldPolicy.sample\(batch, n, sampling\) needs a `generator` argument"):
        RLVRModule(OldPolicy(vocab_size=5, prompt_length=3), rollout_staleness=1)


def test_what_the_sampler_computed_becomes_the_behaviour_log_probs():
    torch.manual_seed(0)
    policy = ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4)
    rollouts = AsyncRollouts(policy, group_size=2, sampling=RLVRModule(policy).sampling)
    rollout = rollouts.sample_now({"prompt": [[1, 2, 3]]}, version=0).rollout
    assert rollout.old_log_probs is None  # the trainer's own, at the weights it trains from, come later
    torch.testing.assert_close(rollout.sampling_log_probs, policy.token_log_probs(rollout)[0].detach())


def test_a_muted_thread_reports_no_progress():
    from rlvr_lightning import stage_reports

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
    rollouts.ready = None  # taken by the training step (its move to the device is CUDA work)
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

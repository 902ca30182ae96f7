"""Asynchronous rollouts (`RLVRModule(rollout_staleness=K)`, K >= 1): the next rollout is sampled in a background
thread while the current one trains, K updates behind (K = 1: verl's one-step off-policy trainer; AReaL's
bounded staleness, prime-rl's `async_level`, for K >= 2).

Lightning hands `training_step` one prompt batch at a time, so the stream shifts by one: step t trains on
the rollout of batch t-1 while batch t is sampled beside the update.

    step 0:   sample batch 0 (nothing to overlap with)                                        no update
    step t:   take R_{t-1}; score it; push W_t; launch batch t  ──background──▶  R_t = sample(batch t, W_t)
              old / reference log-probs, advantages, update: W_t -> W_{t+1}
              wait for R_t (it is ready when the step ends; checkpoints hold it)

So the rollout trained at step t was sampled with W_{t-1}, the weights before step t-1's update.

Staleness K >= 2 keeps a queue of up to K sampled rollouts: the first K steps only sample (no update), then
step t trains the oldest, sampled K updates ago, and launches batch t beside the update as above. Staleness is
counted in policy versions (updates made), logged every step (`train/async/staleness`, `train/async/queued`);
a rollout more than K versions old (a checkpoint of a run with a larger K) is dropped and its batch sampled
again with the current weights, counted in `train/async/dropped` and logged once. One rollout is in flight at
a time, so pushes still happen only between generations. N steps
make N - 1 updates; the last batch's rollout is sampled and kept (in `last.ckpt`) but trained on only by
a run that continues from that checkpoint. Dynamic sampling's top-ups are sampled by the same sampler
before the launch, with W_t (nothing is in flight then).

Who samples. `policy.sampling_copy()`: for our loops, a copy of the policy that shares its frozen
parameters (a LoRA policy's copy holds only the adapter; a fully trained one doubles the trainable
weights' memory), refreshed by copying the trainable parameters and buffers before each launch; for an
engine with its own weights (`VLLMGeneration`), the policy itself, with the engine's `push_weights` called
here and its push-on-generate turned off while the background generation runs. Either way the generator
never sees weights change under it, and the push blocks nothing but itself: no generation is in flight.

The thread. A new thread starts with none of the training thread's per-thread state, so each background
rollout first takes on what the first (foreground) rollout ran with: torch's thread count, the rank's CUDA
device (a new thread would use cuda:0) and the autocast state of the launching thread (Lightning's
`bf16-mixed` autocast is entered around `training_step`, per thread), captured at the launch.

Streams. On a GPU our loop samples on a CUDA side stream of its own, beside the update on the default
stream: kernels of one stream run in order, so on the default stream the sampler's kernels would wait
behind the update's, and each decoding step's host read would wait for the update's queued work too. The
stream exists only for that overlap: the first rollout and dynamic sampling's top-ups (nothing runs
beside them) sample on the default stream, and an engine with its own weights on the streams it manages.
Memory the sampler frees returns to the side stream's pool and is reused by the next background rollout;
the rollout handed to the training thread is recorded on its stream (`record_stream`), since the update
may free it while the next rollout samples. Clocks read in the thread wait for the side stream only.

Randomness. Each rollout draws one seed from torch's global generator when it is launched (main thread,
a deterministic point of the step) and samples from a `torch.Generator` of its own seeded with it (our
loops; vLLM's per-request seeds come from it too), so the background thread never touches the global
generator the update draws from (mini-batch order), and a resumed run draws the same seeds. A compilation does
(`torch.compile` puts the global generators back as it found them when it ends): a decoding step compiles in the
thread only under `runtime/global_random.py`'s lock, which the training step holds from the launch to the wait.

Loss: AReaL's decoupled PPO (Fu et al. 2025, "AReaL: a large-scale asynchronous reinforcement learning
system for language reasoning", sec. 5.2, after Hilton et al. 2022, "Batch size-invariance for policy
optimization"); verl's one-step off-policy recipe computes the same (old log-probs recomputed by the
trainer, rollout IS against the sampler's log-probs):

    loss_t = -sg(w_t) * min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t)
    r_t = pi_theta(y_t) / pi_prox(y_t)   pi_prox: the trainer at the weights this step starts from (old log-probs)
    w_t = pi_prox(y_t) / pi_behav(y_t)   pi_behav: `rollout.sampling_log_probs`, the sampler one update back;
                                         0 above `rollout_is_max` (`token_mask`, AReaL's behav_imp_weight_cap,
                                         the default here) or truncated there (`token_truncate`, TIS)

No new loss code: the old log-probs are the trainer's as always (`policy_update.py`) and `w_t` is the
`rollout_is` weight. The alternative, the behaviour log-probs as old log-probs (PPO's ratio pi_theta /
pi_behav) plus truncated IS for the engine mismatch, was rejected: its clip range is centred on weights
one update old, so a token the previous update already moved past 1 + eps (A > 0) or 1 - eps (A < 0) gets
no gradient now and the two updates share one trust region (AReaL's argument); and its engine-mismatch
weight needs the trainer's log-probs at the sampling weights, gone once the previous update ran (a second
copy of the weights and a forward pass to keep them). The decoupled loss costs no extra forward pass when
a step makes one update (pi_prox is that update's own detached log-probs), and one, as on-policy PPO does,
otherwise. `train/mismatch/*` then measures staleness and engine mismatch together.

Checkpoints. The rollout waiting to be trained on is complete at the end of every step; the module puts
it in the checkpoint (`state_dict`), so a resumed run trains on exactly what the uninterrupted one did.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import Any

import torch

from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.policies.base import Policy, PromptBatch
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime import stage_reports
from rlvr_lightning.runtime.timing import elapsed_seconds

log = logging.getLogger(__name__)


@dataclasses.dataclass
class SampledRollout:
    """A rollout with what its generation reported, the optimizer steps taken when it was sampled (`version`),
    the policy version (updates made) it was sampled with, and its prompts (to sample again if too stale)."""

    rollout: Rollout
    stats: dict[str, float]
    version: int
    policy_version: int = 0
    batch: PromptBatch | None = None


class AsyncRollouts:
    def __init__(self, policy: Policy, group_size: int, sampling: SamplingConfig, staleness: int = 1) -> None:
        if "generator" not in inspect.signature(policy.sample).parameters:
            raise TypeError(
                f"rollout_staleness={staleness} samples in a background thread with a torch.Generator of its own: "
                f"{type(policy).__name__}.sample(batch, n, sampling) needs a `generator` argument to draw from"
            )
        self.policy = policy
        self.group_size = group_size
        self.sampling = sampling
        self.staleness = staleness
        self.queue: collections.deque[SampledRollout] = collections.deque()  # sampled, not yet trained on, oldest first
        self.policy_version = 0  # updates made (`updated()`)
        self.dropped = 0  # rollouts dropped as too stale
        self._sampler: Policy | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._future: Future | None = None
        self._stream = None  # a CUDA side stream for our loop's background generation

    # ------------------------------------------------------------------ the pipeline

    def take(self, batch: PromptBatch, version: int) -> SampledRollout | None:
        """The rollout to train on now. While fewer than `staleness` rollouts wait (the first steps), `batch` is
        sampled here (optimizer steps `version`) for a later step, and None returned. A rollout more than
        `staleness` policy versions old is dropped and its prompts sampled again now. Nothing is in flight after."""
        self.wait()
        if len(self.queue) < self.staleness:
            self.queue.append(self.sample_now(batch, version))
            return None
        ready = self.queue.popleft()
        if self.policy_version - ready.policy_version > self.staleness:
            self.dropped += 1
            if self.dropped == 1:
                log.warning(
                    "rollout_staleness=%d: a rollout %d versions old was dropped and its prompts sampled again "
                    "(counted in train/async/dropped)",
                    self.staleness,
                    self.policy_version - ready.policy_version,
                )
            ready = self.sample_now(ready.batch if ready.batch is not None else batch, version)
        ready.rollout = ready.rollout.to(self._device())
        return ready

    def updated(self) -> None:
        """The policy's weights changed (an update ran): one policy version more."""
        self.policy_version += 1

    def step_metrics(self, sampled: SampledRollout) -> dict[str, float]:
        """The staleness of the rollout trained now (policy versions), the rollouts waiting, those dropped."""
        return {
            "train/async/staleness": float(self.policy_version - sampled.policy_version),
            "train/async/queued": float(len(self.queue)),
            "train/async/dropped": float(self.dropped),
        }

    def launch(self, batch: PromptBatch, version: int) -> float:
        """Push the current weights (policy version `version`), draw the rollout's seed from torch's global
        generator, and sample `batch` in the background thread. Returns the seconds the push took."""
        if self._future is not None or len(self.queue) >= self.staleness:
            raise RuntimeError(f"a rollout is already in flight, or {self.staleness} wait to be trained on")
        push_seconds = self._push_weights()
        seed = _draw_seed()
        backend = self._engine()
        if backend is not None:
            backend.push_on_generate = False  # pushed above; the update must not reach it mid-generation
        if self._stream is None and self._sampler is not self.policy and self._device().type == "cuda":
            self._stream = torch.cuda.Stream(device=self._device())  # our loop beside the update: see "Streams"
        if self._stream is not None:
            self._stream.wait_stream(torch.cuda.current_stream())  # the pushed weights, before the sampler reads them
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlvr-rollout")
        thread_state = BackgroundThreadState(torch.get_num_threads(), self._device(), autocast_state(self._device()))
        # the policy version is the launch's: the update may end (`updated`) before the sampling does
        self._future = self._executor.submit(self._sample, batch, seed, version, self.policy_version, thread_state)
        return push_seconds

    def wait(self) -> float:
        """Block until the rollout in flight is sampled (it joins the queue); the seconds spent waiting."""
        if self._future is None:
            return 0.0
        started = time.perf_counter()
        try:
            self.queue.append(self._future.result())
        finally:
            self._future = None
            backend = self._engine()
            if backend is not None:
                backend.push_on_generate = True  # between steps (validation) the engine pushes as it always does
        if self._stream is not None:
            torch.cuda.current_stream().wait_stream(self._stream)
            _record_stream(self.queue[-1].rollout, torch.cuda.current_stream())
        return time.perf_counter() - started

    def sample_now(self, batch: PromptBatch, version: int) -> SampledRollout:
        """Sample `batch` in this thread as the background thread does (current weights, a seed of its own):
        the first rollout of the pipeline, and dynamic sampling's top-ups (nothing is in flight then)."""
        if self._future is not None:
            raise RuntimeError("cannot sample while a rollout is in flight")
        self._push_weights()
        return self._sample(batch, _draw_seed(), version, self.policy_version)

    def _sample(
        self,
        batch: PromptBatch,
        seed: int,
        version: int,
        policy_version: int,
        thread: BackgroundThreadState | None = None,
    ) -> SampledRollout:
        """Sample `batch`; `thread`: in the background thread, the training thread's state to take on first."""
        background = thread is not None
        if background:
            thread.enter()
        device = self._device()
        stream = torch.cuda.stream(self._stream) if background and self._stream is not None else nullcontext()
        with (
            stage_reports.muted() if background else nullcontext(),
            stream,
            thread.precision() if background else nullcontext(),
        ):
            generator = torch.Generator(device=self._generator_device()).manual_seed(seed)
            started = time.perf_counter()
            rollout = self._sampler.sample(batch, self.group_size, self.sampling, generator=generator)
            # on this thread's stream: the side stream's work is done before the training thread takes the rollout
            seconds = elapsed_seconds(started, device)
        # What the sampler computed is the behaviour policy's log-probs; the trainer computes its own.
        if rollout.sampling_log_probs is None:
            rollout.sampling_log_probs = rollout.old_log_probs
        if rollout.sampling_log_probs is None:
            raise ValueError(
                "rollout_staleness: 1 weights each token by the sampler's log-probs, and this sampler recorded none "
                "(VLLMGeneration with sampling.top_k, top_p or min_p renormalises them over the kept tokens); "
                "sample with top_p: 1, top_k: 0 and min_p: 0, or with KVCacheGeneration"
            )
        rollout.old_log_probs = None
        stats = dict(getattr(self._sampler, "last_generation_stats", None) or {})
        stats["sampling_seconds"] = seconds
        return SampledRollout(rollout, stats, version, policy_version, batch)

    # ------------------------------------------------------------------ weights

    def _push_weights(self) -> float:
        """The policy's current weights reach the sampler (main thread, nothing in flight); the seconds it took."""
        started = time.perf_counter()
        if self._sampler is None:
            self._sampler = self.policy.sampling_copy()
        backend = self._engine()
        if backend is not None:
            backend.push_weights(self.policy.model, self.policy.tokenizer)
        elif self._sampler is not self.policy:
            copy_weights(self.policy, self._sampler)
        return elapsed_seconds(started, self._device())

    def _engine(self):
        """The sampler's generation backend when it samples from weights of its own, else None."""
        backend = getattr(self._sampler, "generation", None)
        return backend if getattr(backend, "owns_weights", False) else None

    def _device(self) -> torch.device:
        return next(self.policy.parameters()).device

    def _generator_device(self) -> torch.device:
        # an engine's per-request seeds are drawn on the CPU; our loops sample where the policy lives
        return torch.device("cpu") if self._engine() is not None else self._device()

    # ------------------------------------------------------------------ checkpoints and shutdown

    def state_dict(self) -> dict[str, Any]:
        self.wait()
        queue = [
            {
                "rollout": _to_cpu({f.name: getattr(r.rollout, f.name) for f in dataclasses.fields(Rollout)}),
                "stats": dict(r.stats),
                "version": r.version,
                "policy_version": r.policy_version,
                "batch": r.batch,
            }
            for r in self.queue
        ]
        return {"queue": queue, "policy_version": self.policy_version, "dropped": self.dropped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.close()
        if "queue" not in state:  # a checkpoint of rollout_staleness=1 before queues: one rollout or none
            ready = state.get("ready")
            state = {"queue": [] if ready is None else [{**state, "rollout": ready}]}
        self.policy_version = int(state.get("policy_version", 0))
        self.dropped = int(state.get("dropped", 0))
        self.queue = collections.deque(
            SampledRollout(
                Rollout(**entry["rollout"]),
                dict(entry["stats"]),
                int(entry["version"]),
                int(entry.get("policy_version", self.policy_version)),
                entry.get("batch"),
            )
            for entry in state["queue"]
        )
        while len(self.queue) > self.staleness:  # a checkpoint of a run with a larger K: its oldest are too stale
            self.queue.popleft()
            self.dropped += 1
            log.warning("rollout_staleness=%d: the checkpoint's oldest waiting rollout was dropped", self.staleness)

    def close(self) -> None:
        """Wait for the rollout in flight and stop the thread (a later launch starts a new one)."""
        self.wait()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


@torch.no_grad()
def copy_weights(source: torch.nn.Module, target: torch.nn.Module) -> None:
    """`target`'s parameters and buffers <- `source`'s of the same name, skipping the tensors they share."""
    for named in ("named_parameters", "named_buffers"):
        sources = dict(getattr(source, named)())
        for name, tensor in getattr(target, named)():
            origin = sources[name]
            if origin is not tensor:
                tensor.copy_(origin)


@dataclasses.dataclass(frozen=True)
class BackgroundThreadState:
    """Per-thread state of the training thread that the background sampler takes on: a new thread starts with
    OpenMP's default thread count (vLLM's CPU kernels read it), on cuda:0, and without autocast."""

    threads: int
    device: torch.device
    autocast: tuple[tuple[str, torch.dtype, bool], ...]  # (device type, dtype, cache enabled) of each active autocast

    def enter(self) -> None:
        torch.set_num_threads(self.threads)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)

    def precision(self) -> AbstractContextManager:
        stack = ExitStack()
        for device_type, dtype, cache in self.autocast:
            stack.enter_context(torch.autocast(device_type, dtype=dtype, cache_enabled=cache))
        return stack


def autocast_state(device: torch.device) -> tuple[tuple[str, torch.dtype, bool], ...]:
    """The calling thread's active autocast contexts for `device`'s type and the CPU (Lightning's mixed
    precision enters one around each training step)."""
    state = []
    for device_type in dict.fromkeys((device.type, "cpu")):
        try:
            enabled = torch.is_autocast_enabled(device_type)
        except RuntimeError:  # a device type autocast does not know (meta)
            continue
        if enabled:
            state.append((device_type, torch.get_autocast_dtype(device_type), torch.is_autocast_cache_enabled()))
    return tuple(state)


def _draw_seed() -> int:
    return int(torch.randint(0, 2**62, (1,)).item())


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


def _record_stream(rollout: Rollout, stream) -> None:
    """Tensors made on the side stream are used on `stream` from now on (the caching allocator must know)."""
    for f in dataclasses.fields(rollout):
        value = getattr(rollout, f.name)
        if isinstance(value, torch.Tensor) and value.is_cuda:
            value.record_stream(stream)

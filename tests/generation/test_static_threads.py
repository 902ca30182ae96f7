"""Static decoding in a background thread (asynchronous rollouts): inductor's graph trees find their per-thread
state there, and compiling the step there does not rewind the random draws the training thread makes meanwhile
(`runtime/global_random.py`)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import torch

from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.runtime.global_random import GLOBAL_RANDOM_LOCK

from .static_pairs import static_only, tiny_model


def test_cuda_graph_trees_can_be_recorded_in_a_background_thread():
    """Background rollouts decode in their own thread: inductor's graph trees must find their per-thread state
    there (torch before 2.12 set it up only in the importing thread and failed an assertion)."""
    from torch._inductor import cudagraph_trees

    from rlvr_lightning.generation.step_capture import cudagraph_trees_in_this_thread

    def in_a_thread():
        cudagraph_trees_in_this_thread()
        return cudagraph_trees.get_container(0)  # what recording a graph looks up first

    with ThreadPoolExecutor(max_workers=1) as pool:
        container = pool.submit(in_a_thread).result()
    assert container.device_index == 0
    cudagraph_trees_in_this_thread()  # the importing thread keeps its own state
    assert cudagraph_trees.get_container(0) is not container


def test_a_step_compiled_in_a_rollout_thread_does_not_rewind_the_training_threads_draws(compile_counts):
    """torch.compile puts torch's global generators back as it found them when a compilation ends: in a rollout
    thread that undid the draws the training thread made meanwhile (its mini-batch orders came again). The training
    thread draws under `GLOBAL_RANDOM_LOCK`, and a compilation waits for it."""
    model = tiny_model("llama")

    def rollout():  # from the rollout's own stream, as asynchronous rollouts sample
        sampling, generator = SamplingConfig(max_new_tokens=8), torch.Generator().manual_seed(1)
        return static_only(model, sampling, prompts=[[5, 6, 7], [8, 9]], n=2, mode="aot_eager", generator=generator)

    torch.manual_seed(0)
    expected = torch.Generator().manual_seed(0)
    torch.rand(100, generator=expected)
    with ThreadPoolExecutor(max_workers=1) as thread:
        with GLOBAL_RANDOM_LOCK:  # the training thread's update, beside the rollout
            future = thread.submit(rollout)
            for _ in range(100):
                torch.rand(1)
                time.sleep(0.01)  # the compilation would start meanwhile
        future.result()
    assert compile_counts["stats"]["unique_graphs"] == 1  # it did compile, in the thread
    assert torch.equal(torch.get_rng_state(), expected.get_state())
